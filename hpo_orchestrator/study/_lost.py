"""A sqlite database that went away under a run: found, and what the run holds saved.

A sqlite file deleted while a run writes to it stays open in the run (its connections hold
the deleted inode): every tell succeeds, into a file nobody can open again, and the run's end
found "no database". A file truncated or overwritten under it loses what was told. Neither
raises an error in the run's own writes, so the file at the storage's path is watched: the
same inode as at the start, and still a sqlite database (its 16-byte header). When it is not,
the run stops (exit 1, :class:`StorageLost`) and saves what it still holds beside the path,
where ``--storage sqlite:///<that file>`` loads it:

- deleted or replaced: the old inode, whole, copied through the run's own open descriptor
  (/proc/self/fd), every trial of the study and of the file's other studies;
- truncated or overwritten: the trials of the run's mirror of the study (what its sampler
  saw: this run's trials and the newest before them), told into a new file with Optuna.

PostgreSQL has no such path: a dropped database or table fails the run's next write.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import BinaryIO

import optuna
from optuna.trial import FrozenTrial

from hpo_orchestrator.errors import RuntimeFailure

__all__ = ["DELETED", "REPLACED", "SqliteWatch", "StorageLost", "finished_in", "save_held", "save_trials"]

DELETED, REPLACED = "was deleted", "was replaced by another file"
_HEADER = b"SQLite format 3\x00"
_CHECK_EVERY_S = 0.5


class StorageLost(RuntimeFailure):
    """The run's sqlite file was deleted, replaced or truncated under it (exit 1)."""


class SqliteWatch:
    """The sqlite file a run writes to, as it was when the run opened it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = _descriptor_of(path)
        info = os.fstat(self._fd)
        self._inode = (info.st_dev, info.st_ino)
        self._checked_at = -float("inf")

    def lost(self, force: bool = False) -> str | None:
        """What happened to the file, or None while it is the run's database still."""
        now = time.monotonic()
        if not force and now - self._checked_at < _CHECK_EVERY_S:
            return None
        self._checked_at = now
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return DELETED
        except OSError:
            return None  # unreadable now (permissions): the writes say what is wrong
        if (info.st_dev, info.st_ino) != self._inode:
            return REPLACED
        header = os.pread(self._fd, len(_HEADER), 0)  # the same inode: read where it is open
        if header != _HEADER:
            return "was truncated" if info.st_size < len(_HEADER) else \
                "was overwritten (no sqlite header)"
        return None

    def save_inode(self) -> Path | None:
        """Copy the run's deleted or replaced database, through the watch's descriptor that
        still has it open, to a new file beside the path (None: the copy is unreadable). Its
        write-ahead log goes with it (a WAL database keeps its newest commits there) and is
        folded into the copy, which is then a file of its own."""
        wal = None
        wal_name = f"{self.path.resolve()}-wal"
        for name in os.listdir("/proc/self/fd"):
            source = f"/proc/self/fd/{name}"
            try:
                link = os.readlink(source)
            except OSError:
                continue
            if link.removesuffix(" (deleted)") == wal_name:
                wal = source
        target = self.rescue_path()
        with open(target, "xb") as new:
            _copy_from(self._fd, new)
        if wal is not None:  # sqlite locks the -shm file, not the log: this open may close
            with open(wal, "rb") as old, open(f"{target}-wal", "xb") as new:
                shutil.copyfileobj(old, new)
        if _readable(target):
            return target
        _remove(target)
        return None

    def rescue_path(self) -> Path:
        """A new name beside the database: ``hpo.saved-20261129-064519.db`` (-2, -3... when
        taken)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1, 1000):
            extra = "" if n == 1 else f"-{n}"
            target = self.path.with_name(f"{self.path.stem}.saved-{stamp}{extra}{self.path.suffix}")
            if not target.exists():
                return target
        raise FileExistsError(target)


# One descriptor per database file for the process's life, never closed: closing any
# descriptor of a file drops every POSIX lock the process holds on it, sqlite's own included
# (sqlite.org/howtocorrupt.html, 2.2.1). A watch that opened and closed the file every 0.5 s
# let another process's last connection take the file's lock as if this run had none, then
# checkpoint and delete the write-ahead log and its index under the run's live connections:
# the next reader got "disk I/O error".
_DESCRIPTORS: dict[tuple[int, int], int] = {}


def _descriptor_of(path: Path) -> int:
    info = os.stat(path)
    key = (info.st_dev, info.st_ino)
    if key not in _DESCRIPTORS:
        _DESCRIPTORS[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    return _DESCRIPTORS[key]


def _copy_from(fd: int, out: BinaryIO) -> None:
    """The whole file behind ``fd``, read at offsets (the descriptor is neither moved nor
    closed)."""
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        out.write(chunk)
        offset += len(chunk)


def save_held(watch: SqliteWatch, what: str,
              study: optuna.Study) -> tuple[Path | None, int, str | None]:
    """Save what the run holds of a lost database: (the file, its finished trials of the
    study, what went wrong where nothing could be saved). Deleted or replaced: the old file
    through the run's descriptors; else, or where that copy holds fewer finished trials, the
    trials of the run's mirror."""
    trouble = None
    if what in (DELETED, REPLACED):
        try:
            copied = watch.save_inode()
            if copied is not None:
                count = finished_in(copied, study.study_name)
                if count >= len(_finished(_held(study))):
                    return copied, count, None
                _remove(copied)
        except (OSError, sqlite3.Error) as exc:
            trouble = str(exc)
    try:
        saved, count = save_trials(_held(study), study, watch.rescue_path())
    except (OSError, sqlite3.Error, optuna.exceptions.OptunaError) as exc:
        return None, 0, trouble or str(exc)
    return saved, count, trouble if saved is None else None


def _held(study: optuna.Study) -> list[FrozenTrial]:
    from hpo_orchestrator.study._storage import MirrorStorage

    mirror = study._storage
    return mirror.held_trials(study._study_id) if isinstance(mirror, MirrorStorage) else []


def _finished(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return sorted((t for t in trials if t.state.is_finished()), key=lambda t: t.number)


def _remove(path: Path) -> None:
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        leftover.unlink(missing_ok=True)


def save_trials(trials: list[FrozenTrial], study: optuna.Study,
                target: Path) -> tuple[Path | None, int]:
    """Tell the finished ``trials`` into a new sqlite study of ``study``'s name and directions
    at ``target``: (the file, or None when there was none to tell; how many)."""
    finished = _finished(trials)
    if not finished:
        return None, 0
    engine_url = f"sqlite:///{target}"
    saved = optuna.create_study(storage=engine_url, study_name=study.study_name,
                                directions=study.directions)
    saved.add_trials(finished)
    return target, len(finished)


def finished_in(path: Path, study_name: str) -> int:
    """Finished trials of the study in a saved copy."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = ? AND t.state IN ('COMPLETE', 'PRUNED', 'FAIL')",
            (study_name,)).fetchone()
    return int(row[0])


def _readable(path: Path) -> bool:
    """Is the copy a sound database? Its log folded in (one file, as the user copies it)."""
    try:
        connection = sqlite3.connect(path)
        try:
            if connection.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return False
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            connection.execute("PRAGMA journal_mode=DELETE")
            return True
        finally:
            connection.close()
    except sqlite3.Error:
        return False
