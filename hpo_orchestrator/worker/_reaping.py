"""Child subreapers: the orchestrator and each of its workers adopt their orphaned descendants.

A process marked a *child subreaper* (``PR_SET_CHILD_SUBREAPER``) gets the descendants whose
parent exits re-parented to it instead of to init, so whatever a trial starts stays a
descendant of its worker while the worker lives, however it left its parent (``setsid``, a
double fork), and a descendant of the orchestrator after the worker is gone.

Hence a worker with no child process at all has no descendant either, and the end of a trial
can say so for one ``waitid`` call (:func:`has_children`): the orchestrator then skips its walk
of every process on the host (scheduler/_tree.py, docs/DESIGN.md §3.8 "Process trees").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable

__all__ = ["become_subreaper", "collect", "has_children", "restore_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def become_subreaper() -> bool | None:
    """Make orphaned descendants re-parent to this process. Returns the previous setting,
    or None where the kernel (or libc) does not offer it: then orphans go to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        previous = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
            return None
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(previous.value)


def restore_subreaper(previous: bool | None) -> None:
    """Undo :func:`become_subreaper` (run_study may run inside a longer-lived process)."""
    if previous is False:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def has_children() -> bool:
    """Has this process any child, running or exited and not yet collected (True where the
    platform cannot tell)? Nothing is collected (``WNOWAIT``): an exit status belongs to
    whoever waits for it, e.g. ``subprocess`` or ``multiprocessing`` for the children the
    objective's setup started (taken from them, multiprocessing would think it still runs)."""
    if not hasattr(os, "waitid"):
        return True
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def collect(pids: Iterable[int]) -> set[int]:
    """Collect the exit status of those of ``pids`` that are exited children of this process,
    so they do not stay zombies; returns the ones to try again (children still running).

    For the processes the orchestrator killed at a trial's end: orphans that came to this
    worker are nobody else's to wait for. A pid that is not (or no longer) our child is
    dropped."""
    again = set()
    for pid in pids:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done == 0:
            again.add(pid)
    return again
