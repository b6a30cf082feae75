"""Host-wide GPU slot leases: lock files that the kernel releases when their holder dies.

Two orchestrators on one host (two studies, or two users) share its GPUs: each trial slot of a
GPU is one file ``<lease_dir>/<gpu uuid>.<k>.lock`` (k < trials_per_gpu), held with an
exclusive flock while a trial runs there. However the holder ends (exit, crash, kill -9),
the kernel drops the lock, so a lease never outlives its orchestrator. The file's content
says who holds it (study, trial, pid, host) for ``hpo-orchestrator gpus``; a file whose lock
is free is free, whatever it says.

Waiting: an orchestrator that finds every slot of a GPU leased by others says so with a
marker ``<uuid>.waiting.<pid>-<token>`` (held with a flock, so it dies with its writer; its content
is when the wait began, its mtime when it last asked). A holder whose reuse worker sits idle
between trials then gives the lease up, and no one takes a slot of that GPU while another
orchestrator has waited for it longer: two studies on one GPU take turns, trial by trial,
instead of the second waiting for the first study to end.

Several users: the folder is made world-writable and sticky (mode 1777, as /tmp: each user
may add files, none may remove another's) and each lock file readable and writable by all
(0666). Both modes are set with chmod after creation, since the umask cuts what mkdir and
open ask for (0022 made them 1755 and 0644, and a second user got "Permission denied"). A lock
file another user made before that, or under a stricter umask, is opened read-only: flock
works on a read-only descriptor, so the lease holds, only its holder note is not written.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo_orchestrator.errors import ConfigError

__all__ = ["Lease", "LeaseDir", "default_lease_dir"]

LEASE_DIR_ENV = "HPO_ORCHESTRATOR_LEASE_DIR"
DIR_MODE = 0o1777  # every user adds files, only their owner removes them
FILE_MODE = 0o666
WAIT_FRESH_S = 5.0  # a waiter asks every loop turn (0.1 s); one silent this long stopped wanting


def default_lease_dir(configured: str | None = None) -> Path:
    """``configured`` if given; else $HPO_ORCHESTRATOR_LEASE_DIR; else one folder in the temp
    dir, shared by every user of the host."""
    return Path(configured or os.environ.get(LEASE_DIR_ENV)
                or Path(tempfile.gettempdir()) / "hpo-orchestrator-leases")


@dataclass
class Lease:
    path: Path
    fd: int
    writable: bool = True  # False: another user's file, opened read-only (no holder note)

    def describe(self, **holder: Any) -> None:
        """Record who holds it (for `hpo-orchestrator gpus`); the lock is what counts."""
        if not self.writable:
            return
        data = json.dumps({**holder, "pid": os.getpid(), "host": socket.gethostname(),
                           "since": time.time()}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        try:
            if self.writable:
                os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)  # closing drops the flock


def _open_shared(path: Path, flags: int) -> int:
    """Open (or create) a file every user of the host may open read-write: chmod after
    creation, as the umask cut the mode ``open`` asked for."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return os.open(path, flags)
    os.fchmod(fd, FILE_MODE)
    return fd


class LeaseDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._waiting: dict[str, tuple[int, Path, float]] = {}  # uuid -> (fd, marker, since)

    def check(self) -> None:
        """Refuse a lease folder that cannot be one (a file, or under a file) or that this
        user cannot add files to, before a run creates its study: the first GPU trial would
        fail on it (ConfigError, exit 2)."""
        existing = next((p for p in (self.path, *self.path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ConfigError(f"GPU lease folder {self.path}: {existing} is not a folder",
                              f"set scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder")
        if existing == self.path:
            self._share()
            if not os.access(self.path, os.W_OK | os.X_OK):
                mode = self.path.stat().st_mode & 0o7777
                raise ConfigError(
                    f"GPU lease folder {self.path} is not writable by this user (mode "
                    f"{mode:o}, owner uid {self.path.stat().st_uid}; an older version made it "
                    "without write access for others)",
                    f"ask its owner to run `chmod 1777 {self.path}`, or set "
                    f"scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder shared by the "
                    "host's users")

    def _share(self) -> None:
        """Give a folder of ours the shared mode (one made before it was set had 1755)."""
        try:
            if self.path.stat().st_uid == os.geteuid() \
                    and self.path.stat().st_mode & 0o7777 != DIR_MODE:
                self.path.chmod(DIR_MODE)
        except OSError:
            pass  # not ours to change: check() says so where it matters

    def _ensure_dir(self) -> None:
        try:
            self.path.mkdir(parents=True, mode=DIR_MODE)
        except FileExistsError:
            return
        self.path.chmod(DIR_MODE)  # mkdir's mode went through the umask

    def _file(self, uuid: str, k: int) -> Path:
        return self.path / f"{uuid}.{k}.lock"

    def try_acquire(self, uuid: str, k: int) -> Lease | None:
        self._ensure_dir()
        path = self._file(uuid, k)
        writable = True
        try:
            fd = _open_shared(path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:  # another user's file of a stricter mode: flock still works
            fd, writable = os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return Lease(path, fd, writable)

    def wait_for(self, uuid: str) -> None:
        """Say (or say again) that this process waits for a slot of the GPU."""
        if uuid in self._waiting:
            os.utime(self._waiting[uuid][1])
            return
        self._ensure_dir()
        path = self.path / f"{uuid}.waiting.{os.getpid()}-{secrets.token_hex(4)}"
        fd = _open_shared(path, os.O_RDWR | os.O_CLOEXEC)  # a new name: never another's
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a name of our own: never contended
        since = time.time()
        os.pwrite(fd, repr(since).encode(), 0)
        self._waiting[uuid] = (fd, path, since)

    def waiting_since(self, uuid: str) -> float:
        """When this process began to wait for the GPU (infinity: it does not wait)."""
        return self._waiting[uuid][2] if uuid in self._waiting else float("inf")

    def stop_waiting(self) -> None:
        for fd, path, _since in self._waiting.values():
            path.unlink(missing_ok=True)
            os.close(fd)
        self._waiting.clear()

    def waited_longer(self, uuid: str) -> bool:
        """Does another live orchestrator of this host wait for the GPU, since before us?"""
        mine = self.waiting_since(uuid)
        own = self._waiting[uuid][1] if uuid in self._waiting else None
        now = time.time()
        for path in self.path.glob(f"{uuid}.waiting.*"):
            if path == own:
                continue
            try:
                if now - path.stat().st_mtime > WAIT_FRESH_S:
                    continue  # it stopped asking (or died: cleaned once its lock is free)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # gone meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer lives and waits
                since = os.pread(fd, 64, 0)
                os.close(fd)
                try:
                    if float(since) < mine:
                        return True
                except ValueError:
                    pass  # being written
                continue
            os.close(fd)
            try:
                path.unlink(missing_ok=True)  # its writer died
            except PermissionError:
                pass  # another user's marker (sticky folder): stale, skipped by its mtime
        return False

    def holders(self, uuid: str) -> dict[int, dict[str, Any]]:
        """The held slots of a GPU: slot k -> who holds it (free slots are left out)."""
        held: dict[int, dict[str, Any]] = {}
        for path in sorted(self.path.glob(f"{uuid}.*.lock")):
            try:
                k = int(path.name[len(uuid) + 1:-len(".lock")])
            except ValueError:
                continue
            lease = self.try_acquire(uuid, k)
            if lease is not None:  # nobody holds it
                os.close(lease.fd)
                continue
            held[k] = _holder_note(path)
        return held


def _holder_note(path: Path) -> dict[str, Any]:
    """Who a held lock file says holds it. A holder that could not write its note (another
    user's file, opened read-only) leaves the note of an earlier holder: shown only while
    that earlier holder's process lives."""
    try:
        note = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(note, dict):
        return {}
    if note.get("host") == socket.gethostname() and isinstance(note.get("pid"), int):
        try:
            os.kill(note["pid"], 0)
        except ProcessLookupError:
            return {}
        except PermissionError:
            pass  # alive, another user's
    return note
