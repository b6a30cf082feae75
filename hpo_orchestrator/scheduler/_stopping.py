"""How a run is stopped from outside (SIGINT, SIGTERM, SIGHUP) or by itself (the failure
policy, study.timeout_s), and how its running children are brought down.

The three signals mean the same: the user (Ctrl-C), a service manager (SIGTERM) or a closed
terminal (SIGHUP) wants the run to end now, leaving nothing RUNNING; the same command resumes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from hpo_orchestrator.scheduler._process import signal_tree
from hpo_orchestrator.scheduler._trial import RunningTrial

__all__ = ["STOP_SIGNALS", "handling_stop_signals", "stop_running", "wait_stopped"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def handling_stop_signals(handler: Callable[[int, FrameType | None], Any] | None = None,
                          ) -> Iterator[None]:
    """While inside, the stop signals call ``handler``; without one they raise
    KeyboardInterrupt as Ctrl-C does (start-up: nothing is running yet, so unwinding is the
    whole of stopping, and the caller reports it like a stopped run, exit 130, not 143).
    The previous handlers come back on leaving."""
    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler or interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_running(running: Iterable[RunningTrial], reason: str, kill_grace_s: float) -> None:
    """SIGTERM each running trial not stopped yet, recording why (``reason``); SIGKILL
    follows after ``kill_grace_s`` (the loop's deadlines)."""
    now = time.monotonic()
    for rt in running:
        if rt.stop_reason is None:
            rt.stop_reason = reason
            signal_tree(rt.process.pid, signal.SIGTERM)
            rt.kill_at = now + kill_grace_s


def wait_stopped(running: Iterable[RunningTrial], kill_grace_s: float, hard: bool) -> None:
    """Signal every running child (SIGKILL at once when ``hard``: a second Ctrl-C) and wait
    until all have exited, SIGKILL once ``kill_grace_s`` has passed."""
    trials = list(running)
    grace_end = time.monotonic() + kill_grace_s
    for rt in trials:
        if rt.stop_reason is None:
            rt.stop_reason = "interrupted"
        if rt.process.poll() is None:
            signal_tree(rt.process.pid, signal.SIGKILL if hard else signal.SIGTERM)
    killed = False
    while any(rt.process.poll() is None for rt in trials):
        if not killed and time.monotonic() >= grace_end:
            killed = True
            for rt in trials:
                signal_tree(rt.process.pid, signal.SIGKILL)
        time.sleep(0.05)
