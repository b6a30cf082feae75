"""Trial child processes: their birth (environment fixed, pinned to a slot), their end
(asked, then killed with their whole tree), and what the kernel and their log say about
how they died."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from hpo_orchestrator.scheduler._channel import Channel, ProtocolError
from hpo_orchestrator.scheduler._trial import Worker
from hpo_orchestrator.worker import ChildEnv

__all__ = ["cgroup_oom_kills", "log_tail", "oom_killed_since", "retire_worker", "signal_tree", "start_worker"]


def start_worker(child: ChildEnv, extra_env: dict[str, str], slot_id: int, log_path: Path) -> Worker:
    """A new child process pinned to the slot: its environment is fixed here, at birth, on
    top of ours (``extra_env``: e.g. the NVIDIA OpenCL registration on a GPU slot).

    Its stdout and stderr go to ``log_path``, the log of its first trial (imports and the
    objective's setup print there); a reused child switches to each next trial's log itself
    (``Job.log_path``). Opened for appending, so a rotation (scheduler/_logs.cap_log) that
    truncates it lets the child write on at the new end.
    """
    env = {**os.environ, **child.render(), **extra_env}
    ours, theirs = socket.socketpair()
    log = open(log_path, "ab")  # owned by the Worker, closed at its retirement
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "hpo_orchestrator.worker", str(theirs.fileno()),
             str(os.getpid())],  # the child dies with us (PR_SET_PDEATHSIG), even if we go first
            env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:
        ours.close()
        log.close()
        raise
    finally:
        theirs.close()
    return Worker(process=process, connection=Channel(ours), log=log,
                  cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"])


def retire_worker(worker: Worker, grace_s: float) -> None:
    """Stop a worker process: ask it to exit, kill its tree if it does not within ``grace_s``."""
    try:
        worker.connection.send(None)  # never blocks: a child that reads nothing is killed below
    except ProtocolError:
        pass
    worker.connection.close()
    try:
        worker.process.wait(timeout=max(1.0, grace_s))
    except subprocess.TimeoutExpired:
        signal_tree(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
    worker.log.close()


def signal_tree(pid: int, sig: int) -> None:
    """Signal a child, its process group and every descendant (DataLoader workers...)."""
    try:
        targets = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        targets = []
    try:
        os.killpg(pid, sig)  # children run in their own session: pgid == pid
    except OSError:
        pass
    for proc in targets:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def cgroup_oom_kills() -> int | None:
    """The kernel OOM killer's count for our cgroup (v2), to tell 'oom' from 'killed'."""
    try:
        with open("/proc/self/cgroup") as handle:
            path = handle.read().strip().split("::", 1)[-1]
        with open(f"/sys/fs/cgroup{path}/memory.events") as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_killed_since(count_at_spawn: int | None) -> bool:
    """Has the kernel's OOM killer acted in our cgroup since the trial's spawn?"""
    now = cgroup_oom_kills()
    return count_at_spawn is not None and now is not None and now > count_at_spawn


def log_tail(log_path: Path) -> str:
    """The last non-empty line a child printed (native crashes only say it there)."""
    from hpo_orchestrator.scheduler._logs import read_tail

    lines = read_tail(log_path, lines=1, limit=4096)
    return lines[-1].strip() if lines else ""
