"""Each trial's own log file: what its child printed (stdout, stderr, native crashes) and, for a
failed trial, the traceback, so a failing objective is never a black box.

Layout: a run folder beside the sqlite database (``<db dir>/hpo-runs/<study>/``), or under the
current folder for a server database, or ``scheduler.log_dir``; one ``trial-<N>.log`` per trial
(its path recorded in ``hpo.log_path``). The folder holds a ``.gitignore`` of ``*``, so neither
the logs nor the sqlite lock files kept there show in ``git status``.

Size (scheduler.log_max_mib): a thread of its own, never the loop, looks at the running
trials' logs ten times a second; one over the cap keeps its last cap of bytes in
``trial-<N>.log.1`` and is truncated (the child writes with O_APPEND, so it goes on at the new
end), and an ended trial's log is looked at once more. So a trial leaves at most twice the cap
on disk whatever it printed, and no copy is ever larger than the cap. Between two looks a trial
can write what the disk takes in a tenth of a second: a bound in practice, not a hard one. (A hard
one needs the bytes to pass through a reader that can refuse them: a pipe to a process of ours
per worker, with the per-trial switching of reused workers moved out of the child; a thread
in the child would stall on the GIL of an objective printing from native code.) Bytes
written between the copy and the truncation are lost, as with logrotate's copytruncate.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import socket
import threading
from collections import deque
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "TRACEBACK_CAP",
    "LogCap",
    "append_traceback",
    "cap_log",
    "ensure_run_dir",
    "keep_traceback",
    "read_tail",
    "run_dir",
    "spare_log_path",
    "sweep_startup_logs",
    "take_startup_log",
    "trial_log_path",
    "user_frames",
]

TRACEBACK_CAP = 8000  # characters of hpo.traceback kept (its end: the frames nearest the error)
_MAX_FOLDER_NAME = 200  # a study's run folder name; most file systems allow 255 bytes
_IGNORE_ALL = "# written by hpo-orchestrator: trial logs and lock files\n*\n"


def run_dir(storage_url: str, study: str, log_dir: str | None = None) -> Path:
    """The study's run folder (not created here)."""
    from hpo_orchestrator.db.connect import sqlite_path

    if log_dir:
        base = Path(log_dir).expanduser()
    else:
        db_file = sqlite_path(storage_url)
        base = (db_file.parent if db_file is not None else Path.cwd()) / "hpo-runs"
    return base.absolute() / _safe(study)


def _safe(name: str) -> str:
    """A study name as one folder name. Study names are free text, up to 512 characters; a
    file name, 255 bytes of a few safe characters. A name that is already safe is its own
    folder; any other (``exp 1``, ``Σx``, a long one) keeps its safe start plus a hash of the
    whole name, so names that differ only in what was replaced (``exp 1`` and ``exp_1``,
    ``Σx`` and ``Δx``) never share a folder: not their logs, process records or artifacts."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip(".") or "study"
    if safe == name and len(safe) <= _MAX_FOLDER_NAME:
        return safe
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return f"{safe[:_MAX_FOLDER_NAME - len(digest) - 1]}-{digest}"


def trial_log_path(folder: Path, number: int) -> Path:
    return folder / f"trial-{number}.log"


def spare_log_path(folder: Path, slot_id: int) -> Path:
    """A spare worker's start-up output until its first trial (which takes it into its log).
    Named with this host and orchestrator's pid: two orchestrators of one study (on a host,
    or on hosts sharing the run folder) number their slots alike."""
    return folder / f"spare-slot{slot_id}-{socket.gethostname()}-{os.getpid()}.log"


def sweep_startup_logs(folder: Path) -> None:
    """The start-up logs of this host's orchestrators that are gone (killed before their
    first trials took the logs); another host's are left alone (its pids are not ours)."""
    import psutil

    for path in folder.glob(f"spare-slot*-{glob.escape(socket.gethostname())}-*.log"):
        pid = path.stem.rsplit("-", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            path.unlink(missing_ok=True)


def take_startup_log(folder: Path, slot_id: int, log_path: Path, number: int) -> None:
    """A first-wave worker still starting up is handed trial ``number``: its start-up output
    so far becomes the start of the trial's log (renamed: the worker writes on into the same
    file, and its own copy at the trial's start finds nothing left to copy), so the log the
    run prints and ``logs N`` shows exists and holds the setup's output."""
    startup = spare_log_path(folder, slot_id)
    if log_path.exists() or not startup.exists():
        return
    try:
        with open(startup, "ab") as out:
            out.write(f"[hpo-orchestrator] trial {number} was handed to this worker while its "
                      "start-up (imports, objective.setup) still ran; its output so far is "
                      "above\n".encode())
        startup.rename(log_path)
    except OSError:
        pass  # the worker copies what it can at the trial's start (worker/_child.py)


def ensure_run_dir(folder: Path) -> Path:
    """Create the run folder, with a .gitignore of ``*`` beside it: at the top of ``hpo-runs``,
    or of a ``scheduler.log_dir`` made here; never in a folder of the user's that was there
    (``scheduler.log_dir=.`` is the project itself, which ``*`` would hide from git)."""
    ours = folder.parent.name == "hpo-runs" or not folder.parent.exists()
    folder.mkdir(parents=True, exist_ok=True)
    ignore = folder.parent / ".gitignore"
    if ours and not ignore.exists():
        ignore.write_text(_IGNORE_ALL)
    return folder


def cap_log(path: Path, limit_bytes: int) -> bool:
    """Once ``path`` is over ``limit_bytes``: its last ``limit_bytes`` to ``path.1`` (replacing
    it), then ``path`` truncated. Copies at most ``limit_bytes``, however big the log grew."""
    try:
        size = path.stat().st_size
        if size <= limit_bytes:
            return False
        with open(path, "rb") as source, open(path.with_name(path.name + ".1"), "wb") as kept:
            source.seek(size - limit_bytes)
            left = limit_bytes
            while left > 0 and (chunk := source.read(min(left, 2**20))):
                kept.write(chunk)
                left -= len(chunk)
        os.truncate(path, 0)
    except OSError:
        return False
    return True


class LogCap:
    """Holds the running trials' logs to scheduler.log_max_mib from a thread of its own: the
    loop only hands over which logs are running (``check``), so a stat per trial or the copy
    of a rotation never stalls it. ``close`` at the run's end gives every log a last look."""

    CHECK_S = 0.1

    def __init__(self, max_mib: float) -> None:
        self.limit_bytes = int(max_mib * 2**20)
        self._lock = threading.Lock()
        self._running: frozenset[Path] = frozenset()
        self._ended: frozenset[Path] = frozenset()  # no longer running, not looked at since
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, paths: Iterable[Path | None]) -> None:
        running = frozenset(p for p in paths if p is not None)
        with self._lock:
            self._ended |= self._running - running
            self._running = running
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="hpo-log-cap", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while True:
            self._look()
            if self._stop.wait(self.CHECK_S):
                return

    def _look(self) -> None:
        with self._lock:
            paths, self._ended = self._running | self._ended, frozenset()
        for path in paths:  # a trial ended since the last look: its last output too
            cap_log(path, self.limit_bytes)

    def close(self) -> None:
        """The run's end: the thread stops, and every log it was given gets a last look."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._look()


def append_traceback(path: Path, traceback: str) -> None:
    """The child's traceback at the end of its log (the objective's own output comes first)."""
    try:
        with open(path, "a", encoding="utf-8", errors="replace") as handle:
            handle.write(f"\n--- traceback (also in the trial's hpo.traceback) ---\n{traceback.rstrip()}\n")
    except OSError:
        pass


def keep_traceback(traceback: str | None, log_path: Path | None) -> str | None:
    """A failed trial's traceback, the objective's frames: appended to its log, and returned
    capped for hpo.traceback (None when there is none)."""
    frames = user_frames(traceback) if traceback else None
    if not frames:
        return None
    if log_path is not None:
        append_traceback(log_path, frames)
    return frames[-TRACEBACK_CAP:]


def user_frames(traceback: str) -> str:
    """The traceback without the frames of our child bootstrap (hpo_orchestrator/worker), so its
    last lines are the objective's own."""
    kept: list[str] = []
    skipping = False
    for line in traceback.splitlines():
        if line.startswith('  File "'):
            skipping = f"{os.sep}hpo_orchestrator{os.sep}worker{os.sep}" in line
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def read_tail(path: Path, lines: int = 10, limit: int = 64 * 1024) -> list[str]:
    """The last non-empty ``lines`` lines of ``path`` (at most its last ``limit`` bytes)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return list(deque((ln.rstrip() for ln in text.splitlines() if ln.strip()), maxlen=lines))
