"""How a run's running children are brought down when it is stopped from outside (the stop
signals of hpo_orchestrator/_signals.py) or by itself (the failure policy, study.timeout_s)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable

from hpo_orchestrator.scheduler._process import signal_tree
from hpo_orchestrator.scheduler._trial import RunningTrial

__all__ = ["stop_running", "wait_stopped"]

def stop_running(running: Iterable[RunningTrial], reason: str, kill_grace_s: float,
                 error: str | None = None) -> None:
    """SIGTERM each running trial not stopped yet, recording why (``reason``, and ``error``
    for its hpo.error where the reason's own text would not say it); SIGKILL follows after
    ``kill_grace_s`` (the loop's deadlines)."""
    now = time.monotonic()
    for rt in running:
        if rt.stop_reason is None:
            rt.stop_reason = reason
            rt.stop_error = error
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
