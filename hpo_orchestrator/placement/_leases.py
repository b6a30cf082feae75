"""Host-wide GPU slot leases: lock files that the kernel releases when their holder dies.

Two orchestrators on one host (two studies, or two users) share its GPUs: each trial slot of a
GPU is one file ``<lease_dir>/<gpu uuid>.<k>.lock`` (k < trials_per_gpu), held with an
exclusive flock while a trial runs there. However the holder ends (exit, crash, kill -9),
the kernel drops the lock, so a lease never outlives its orchestrator. A file whose lock is
free is free, whatever it says.

Who holds a lease is what the kernel says: the pid of the lock in /proc/locks and that
process's uid in /proc/<pid>/status. The file's note (study, trial, host) is shown beside them
only when it cannot be another's forgery: the file is the holder's own (its owner is the
holder's uid), nobody else may write it (mode 0644), and the note names the kernel's pid.

Waiting: an orchestrator that finds every slot of a GPU leased by others says so with a
marker ``<uuid>.waiting.<pid>-<token>`` (held with a flock, so it dies with its writer; its content
is when the wait began, its mtime when it last asked). A holder whose reuse worker sits idle
between trials then gives the lease up, and no one takes a slot of that GPU while another
orchestrator has waited for it longer: two studies on one GPU take turns, trial by trial,
instead of the second waiting for the first study to end.

Several users, and not all of them friendly (docs/HOSTS.md, "A lease folder shared by
users"): the folder is sticky and writable by all (mode 1777, as /tmp: each user may add
files, none may remove another's). Everything in it is opened relative to the folder's own
descriptor with O_NOFOLLOW and checked on the open descriptor (fstat: a regular file with one
link), never path-then-open: a link or a device planted by another user is never written or
read; a note or marker is read at most READ_CAP bytes. A folder writable by others without the
sticky bit is refused (anyone could remove or replace a lease); a folder of another user is
used only in that shared mode (its owner can still remove files, which at worst lets two
trials share a slot: no user can be kept off a GPU by leases, see HOSTS.md). Modes are set
with fchmod after creation, since the umask cuts what mkdir and open ask for (0022 made them
1755 and 0644). A lock file of another user is opened read-only: flock works on a read-only
descriptor, so the lease holds, only no note is written.

The host's cores (placement/_cores.py): a run with trials on CPU slots holds a presence file
``cores.<pid>-<token>.lock`` for its whole length, by the same rules: made with O_EXCL under
a name of its own, locked, its note (the CPUs it runs on, its CPU trials and their threads)
trusted as a lease's note is. It leases nothing: other runs read it to say that trials share
cores (docs/HOSTS.md, "Several runs on one host's cores").
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo_orchestrator.errors import ConfigError

__all__ = ["CORES_PREFIX", "Lease", "LeaseDir", "default_lease_dir", "describe_holder", "user_name"]

LEASE_DIR_ENV = "HPO_ORCHESTRATOR_LEASE_DIR"
DIR_MODE = 0o1777  # every user adds files, only their owner removes them
FILE_MODE = 0o644  # the holder note: written by the file's owner only, so it cannot be forged
READ_CAP = 4096  # bytes ever read of a lease file or marker (a note is about 150)
WAIT_FRESH_S = 5.0  # a waiter asks every loop turn (0.1 s); one silent this long stopped wanting
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NOTE_KEYS = ("study", "trial", "trial_pid", "host", "since")
CORES_PREFIX = "cores."  # a run's presence on the host's cores: cores.<pid>-<token>.lock
_CORE_NOTE_KEYS = ("study", "host", "since", "cpus", "trials", "threads", "wanted")
# a presence file found unlocked is its run's leftover (it died) once it is this old: a new
# one is locked right after it is made, so a younger one may be a run's that is starting
CORES_STALE_S = 10.0
# live presences read per look at most (each a flock and a read of /proc/locks): beyond that
# many runs on one host's cores, naming each one more says nothing new
CORES_READ_MAX = 64


def default_lease_dir(configured: str | None = None) -> Path:
    """``configured`` if given; else $HPO_ORCHESTRATOR_LEASE_DIR; else one folder in the temp
    dir, shared by every user of the host."""
    return Path(configured or os.environ.get(LEASE_DIR_ENV)
                or Path(tempfile.gettempdir()) / "hpo-orchestrator-leases")


class _NotAFile(Exception):
    """A name in the folder that is not a lease file of its own: never written or read."""

    def __init__(self, what: str, uid: int) -> None:
        super().__init__(what)
        self.what, self.uid = what, uid


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


def _open_entry(dir_fd: int, name: str, create: bool) -> tuple[int, bool]:
    """Open a lease file or marker in the folder: (descriptor, ours to write).

    Never through a link (O_NOFOLLOW; O_CREAT|O_EXCL never follows one either), never a FIFO
    or a device (O_NONBLOCK, then fstat on the descriptor), never a file linked elsewhere
    (one link only): _NotAFile for those. A file of ours is opened read-write, another
    user's read-only (flock works on either)."""
    if create:
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN, FILE_MODE,
                         dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            os.fchmod(fd, FILE_MODE)  # the umask cut the mode asked for
            return fd, True
    writable = True
    try:
        try:
            fd = os.open(name, os.O_RDWR | _OPEN, dir_fd=dir_fd)
        except PermissionError:
            fd, writable = os.open(name, os.O_RDONLY | _OPEN, dir_fd=dir_fd), False
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _NotAFile("a symbolic link", _owner(dir_fd, name)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise _NotAFile("not a plain file" if not stat.S_ISREG(info.st_mode)
                        else f"a file with {info.st_nlink} links", info.st_uid)
    ours = writable and info.st_uid == os.geteuid()  # never a note in another user's file
    if ours and stat.S_IMODE(info.st_mode) != FILE_MODE:
        os.fchmod(fd, FILE_MODE)  # one an older version made writable by all (0666)
    return fd, ours


def _owner(dir_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid
    except OSError:
        return -1


def _read_capped(fd: int) -> bytes:
    return os.pread(fd, READ_CAP, 0)


def _kernel_lock_pids(info: os.stat_result) -> list[int]:
    """The pids /proc/locks gives for the locks held on the file (blocked waiters left out).

    Matched by device and inode; by inode alone where no device matches (a filesystem whose
    stat device is not the superblock's, as btrfs subvolumes) and only one file has it."""
    try:
        with open("/proc/locks", "rb") as locks:
            lines = locks.read(4 << 20).decode(errors="replace").splitlines()
    except OSError:
        return []
    exact: list[int] = []
    by_inode: dict[str, list[int]] = {}
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}"
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        dev, _, ino = fields[5].rpartition(":")
        if ino != str(info.st_ino) or not fields[4].lstrip("-").isdigit():
            continue
        pid = int(fields[4])
        (exact if dev == device else by_inode.setdefault(dev, [])).append(pid)
    if exact or len(by_inode) != 1:
        return exact
    return next(iter(by_inode.values()))


def _process_uid(pid: int) -> int | None:
    """The real uid of a live process, as the kernel reports it (None: gone or hidden)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read(READ_CAP * 4).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def user_name(uid: int | None) -> str:
    if uid is None or uid < 0:
        return "an unknown user"
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def describe_holder(holder: dict[str, Any]) -> str:
    """One line on who holds a slot, for the run's notes and `gpus`: the kernel's facts first,
    then what the holder's own note adds."""
    if "blocked" in holder:
        return (f"blocked by {holder['blocked']} of {user_name(holder.get('file_uid'))} "
                "(never followed or written; only its owner or root can remove it)")
    pid = holder.get("pid")
    if pid is None:
        who = f"a process /proc does not show (another PID namespace, or exited; the file is " \
              f"{user_name(holder.get('file_uid'))}'s)"
    elif holder.get("uid") is None:
        who = f"pid {pid}, which has exited (a descriptor it passed on still holds the lock)"
    else:
        who = f"{user_name(holder['uid'])}, pid {pid}"
    if "study" in holder:
        who += f": study {holder['study']} trial {holder.get('trial', '?')}"
        if holder.get("trial_pid"):
            who += f" (trial pid {holder['trial_pid']})"
    return who


def _holder(fd: int, info: os.stat_result, keys: tuple[str, ...] = _NOTE_KEYS) -> dict[str, Any]:
    """Who holds a locked lease file, as the kernel says, and its note's ``keys`` where
    trusted."""
    pids = _kernel_lock_pids(info)
    pid = next((p for p in pids if p > 0), None)
    uid = _process_uid(pid) if pid is not None else None
    held: dict[str, Any] = {"pid": pid, "uid": uid, "file_uid": info.st_uid}
    if uid is None or uid != info.st_uid or stat.S_IMODE(info.st_mode) & 0o022:
        return held  # another's file, or one others may write: its note may be forged
    try:
        note = json.loads(_read_capped(fd) or b"{}")
    except ValueError:
        return held
    if isinstance(note, dict) and note.get("pid") == pid:
        held.update({k: note[k] for k in keys if k in note})
    return held


class LeaseDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._waiting: dict[str, tuple[int, str, float]] = {}  # uuid -> (fd, marker, since)
        self.turn_of: dict[str, dict[str, Any]] = {}  # uuid -> the waiter we yield to

    def check(self) -> None:
        """Refuse a lease folder that cannot be one (a file, or under a file; a link of
        another user; one others may write without the sticky bit) or that this user cannot
        add files to, before a run creates its study: the first GPU trial would fail on it
        (ConfigError, exit 2)."""
        existing = next((p for p in (self.path, *self.path.parents) if p.exists()
                         or p.is_symlink()), None)
        if existing is not None and not existing.is_dir() and not existing.is_symlink():
            raise ConfigError(f"GPU lease folder {self.path}: {existing} is not a folder",
                              f"set scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder")
        if existing == self.path:
            with self._folder(create=False):
                pass

    @contextmanager
    def _folder(self, create: bool) -> Iterator[int]:
        """The folder's descriptor, its owner and mode checked on it (ConfigError)."""
        if create:
            self._ensure_dir()
        fd = self._open_folder()
        try:
            info = os.fstat(fd)
            if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != DIR_MODE:
                os.fchmod(fd, DIR_MODE)  # ours, made before the shared mode was set (1755)
                info = os.fstat(fd)
            self._check_mode(fd, info)
            yield fd
        finally:
            os.close(fd)

    def owner(self) -> int | None:
        """The folder's owner (None: no folder yet)."""
        try:
            return self.path.lstat().st_uid
        except OSError:
            return None

    def _open_folder(self) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            return os.open(self.path, flags | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ENOTDIR and not self.path.is_symlink():
                raise ConfigError(f"GPU lease folder {self.path} is not a folder",
                                  f"set scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder") \
                    from None
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        # a link: followed only when it is ours or root's (as fs.protected_symlinks does in
        # a sticky folder), then judged by what it leads to
        owner = self.path.lstat().st_uid
        if owner not in (0, os.geteuid()):
            raise ConfigError(
                f"GPU lease folder {self.path} is a symbolic link of {user_name(owner)}: "
                "not followed", f"set scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder "
                "of yours, or ask its owner or root to remove the link")
        try:
            return os.open(self.path, flags)
        except (FileNotFoundError, NotADirectoryError):
            raise ConfigError(f"GPU lease folder {self.path} is a link to no folder",
                              f"set scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder") \
                from None

    def _check_mode(self, fd: int, info: os.stat_result) -> None:
        mode = stat.S_IMODE(info.st_mode)
        where = f"mode {mode:o}, owner {user_name(info.st_uid)}"
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise ConfigError(
                f"GPU lease folder {self.path} is writable by other users without the sticky "
                f"bit ({where}): any of them could remove or replace a lease",
                f"ask its owner to run `chmod 1777 {self.path}` (or root to create it so), or "
                f"set scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder of yours")
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=fd):
            raise ConfigError(
                f"GPU lease folder {self.path} is not writable by this user ({where}; an older "
                "version made it without write access for others)",
                f"ask its owner to run `chmod 1777 {self.path}`, or set "
                f"scheduler.lease_dir (or ${LEASE_DIR_ENV}) to a folder shared by the "
                "host's users")

    def _ensure_dir(self) -> None:
        try:
            self.path.mkdir(parents=True, mode=0o700)  # shared once checked (_folder)
        except FileExistsError:
            pass

    def _file(self, uuid: str, k: int) -> str:
        return f"{uuid}.{k}.lock"

    def try_acquire(self, uuid: str, k: int) -> Lease | None:
        """The slot's lease, or None: held by another, or its name taken by something that is
        not a lease file of its own (a link, a device: never followed)."""
        with self._folder(create=True) as dir_fd:
            name = self._file(uuid, k)
            try:
                fd, writable = _open_entry(dir_fd, name, create=True)
            except _NotAFile:
                return None  # holders() names its owner
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return Lease(self.path / name, fd, writable)

    def wait_for(self, uuid: str) -> None:
        """Say (or say again) that this process waits for a slot of the GPU."""
        if uuid in self._waiting:
            os.utime(self._waiting[uuid][0])
            return
        with self._folder(create=True) as dir_fd:
            name = f"{uuid}.waiting.{os.getpid()}-{secrets.token_hex(4)}"
            fd, _ours = _open_entry(dir_fd, name, create=True)  # a new name: never another's
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a name of our own: never contended
        since = time.time()
        os.pwrite(fd, repr(since).encode(), 0)
        self._waiting[uuid] = (fd, name, since)

    def waiting_since(self, uuid: str) -> float:
        """When this process began to wait for the GPU (infinity: it does not wait)."""
        return self._waiting[uuid][2] if uuid in self._waiting else float("inf")

    def stop_waiting(self) -> None:
        if not self._waiting:
            return
        try:
            with self._folder(create=False) as dir_fd:
                for _fd, name, _since in self._waiting.values():
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except FileNotFoundError:
                        pass
        except (OSError, ConfigError):
            pass  # the folder went: its markers with it
        finally:
            for fd, _name, _since in self._waiting.values():
                os.close(fd)
            self._waiting.clear()

    def waited_longer(self, uuid: str) -> bool:
        """Does another live orchestrator of this host wait for the GPU, since before us?"""
        mine = self.waiting_since(uuid)
        own = self._waiting[uuid][1] if uuid in self._waiting else None
        now = time.time()
        self.turn_of.pop(uuid, None)
        with self._folder(create=True) as dir_fd:
            for name in os.listdir(dir_fd):
                if not name.startswith(f"{uuid}.waiting.") or name == own:
                    continue
                try:
                    fd, _ours = _open_entry(dir_fd, name, create=False)
                except (OSError, _NotAFile):
                    continue  # gone meanwhile, or planted: never read
                try:
                    info = os.fstat(fd)
                    if now - info.st_mtime > WAIT_FRESH_S:
                        continue  # it stopped asking (or died: cleaned once its lock is free)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:  # its writer lives and waits
                        try:
                            since = float(os.pread(fd, 64, 0))
                        except ValueError:
                            continue  # being written
                        if since < mine:
                            self.turn_of[uuid] = _holder(fd, info)
                            return True
                        continue
                    try:
                        os.unlink(name, dir_fd=dir_fd)  # its writer died
                    except PermissionError:
                        pass  # another user's marker (sticky folder): stale, skipped by its mtime
                finally:
                    os.close(fd)
        return False

    def announce_cores(self, **note: Any) -> Lease:
        """Hold this run's presence on the host's cores until :meth:`withdraw` (or its death:
        the kernel drops the lock); ``note``: what other runs read of it (placement/_cores.py).
        ConfigError where the folder cannot be used, OSError where it cannot be written."""
        with self._folder(create=True) as dir_fd:
            name = f"{CORES_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.lock"
            fd, _ours = _open_entry(dir_fd, name, create=True)  # a new name: never another's
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a name of our own: never contended
        lease = Lease(self.path / name, fd)
        try:
            lease.describe(**note)
        except OSError:
            self.withdraw(lease)  # a presence no one can read is none
            raise
        return lease

    def withdraw(self, lease: Lease) -> None:
        """Remove a presence file of ours and drop its lock (the folder gone: nothing to do)."""
        try:
            with self._folder(create=False) as dir_fd:
                os.unlink(lease.path.name, dir_fd=dir_fd)
        except (OSError, ConfigError):
            pass  # the folder went, or changed under the run: the lock still drops below
        finally:
            os.close(lease.fd)

    def core_users(self, own: Lease | None = None) -> list[dict[str, Any]]:
        """The live runs of this host that announced their cores, ``own`` left out: the
        kernel's pid and uid of each (``pid``, ``uid``, ``file_uid``) and the trusted part of
        its note. A leftover of a run that died is removed where this user may (one of
        another user's stays in a sticky folder, and is skipped). ConfigError where the folder
        cannot be used; no folder yet: nobody."""
        try:
            with self._folder(create=False) as dir_fd:
                return _core_users(dir_fd, own.path.name if own is not None else None)
        except FileNotFoundError:
            return []

    def holders(self, uuid: str) -> dict[int, dict[str, Any]]:
        """The held slots of a GPU: slot k -> who holds it (free slots are left out): the
        kernel's pid and uid (``pid``, ``uid``), the file's owner (``file_uid``), the trusted
        part of its note; or ``blocked``: what sits at the slot's name instead of a file."""
        try:
            with self._folder(create=False) as dir_fd:
                return _held(dir_fd, uuid)
        except FileNotFoundError:
            return {}  # no folder yet: nothing held


def _held(dir_fd: int, uuid: str) -> dict[int, dict[str, Any]]:
    held: dict[int, dict[str, Any]] = {}
    for name in sorted(os.listdir(dir_fd)):
        if not (name.startswith(f"{uuid}.") and name.endswith(".lock")):
            continue
        try:
            k = int(name[len(uuid) + 1:-len(".lock")])
            fd, _ours = _open_entry(dir_fd, name, create=False)
        except ValueError:
            continue
        except _NotAFile as bad:
            held[k] = {"blocked": bad.what, "file_uid": bad.uid}
            continue
        except OSError:
            continue  # gone meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held[k] = _holder(fd, os.fstat(fd))
        finally:
            os.close(fd)  # a lock of ours on it drops with it
    return held


def _core_users(dir_fd: int, own: str | None) -> list[dict[str, Any]]:
    users: list[dict[str, Any]] = []
    now = time.time()
    for name in sorted(os.listdir(dir_fd)):
        if not (name.startswith(CORES_PREFIX) and name.endswith(".lock")) or name == own:
            continue
        try:
            fd, _ours = _open_entry(dir_fd, name, create=False)
        except (OSError, _NotAFile):
            continue  # gone meanwhile, or planted: never read
        try:
            info = os.fstat(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its run lives
                users.append(_holder(fd, info, _CORE_NOTE_KEYS))
                if len(users) >= CORES_READ_MAX:
                    break
                continue
            if now - info.st_mtime > CORES_STALE_S:
                try:
                    os.unlink(name, dir_fd=dir_fd)  # its run died
                except PermissionError:
                    pass  # another user's (sticky folder): skipped at each look
        finally:
            os.close(fd)
    return users
