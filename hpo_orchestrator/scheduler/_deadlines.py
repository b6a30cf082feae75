"""When the loop stops a running child: its trial ran past ``scheduler.trial_timeout_s``, its
bytes broke the protocol, or another orchestrator finished its trial; SIGKILL once SIGTERM's
grace (``scheduler.kill_grace_s``) runs out.

A trial is timed by what its child could do, not by the loop's wall clock: while the
orchestrator stood still (SIGSTOP, a suspended job), its trials waited for its answers, so
that time does not count against them (:class:`LoopClock`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable

from hpo_orchestrator.scheduler._process import signal_tree
from hpo_orchestrator.scheduler._stopping import stop_running
from hpo_orchestrator.scheduler._trial import RunningTrial

__all__ = ["LoopClock", "StudyDeadline", "enforce_deadlines", "stop_faulty"]

_STALL_S = 2.0  # a loop iteration this much longer than its poll: the loop was stopped


class LoopClock:
    """Notices a loop iteration that took far longer than its poll, and gives the time back
    to the running trials (their timeout and their kill grace move by it)."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._last_tick = time.monotonic()

    def restart(self) -> None:
        """The loop starts (again) now: time spent before, waiting on purpose (the first
        wave's start-up), is no stall to give back."""
        self._last_tick = time.monotonic()

    def discount_stall(self, running: Iterable[RunningTrial]) -> float:
        """Call once per iteration; returns the seconds given back (0 most of the time)."""
        now = time.monotonic()
        stalled = now - self._last_tick - self.poll_s
        self._last_tick = now
        if stalled < _STALL_S:
            return 0.0
        for rt in running:
            rt.paused_s += stalled
            if rt.kill_at is not None:
                rt.kill_at += stalled
        return stalled


class StudyDeadline:
    """study.timeout_s: past it nothing new starts (the loop ends once the running trials
    end); past study.timeout_grace_s more, those still running are stopped (the limit is the
    study's wall clock, pauses included)."""

    def __init__(self, timeout_s: float | None, grace_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.at: float | None = None
        self.passed = False

    def start(self) -> None:
        if self.timeout_s is not None:
            self.at = time.monotonic() + self.timeout_s

    def check(self, running: Iterable[RunningTrial], kill_grace_s: float) -> bool:
        """True once the limit has passed; stops the running trials past its grace."""
        if self.at is None:
            return False
        now = time.monotonic()
        self.passed = self.passed or now >= self.at
        if self.passed and self.grace_s is not None and now >= self.at + self.grace_s:
            stop_running(running, "study_timeout", kill_grace_s)
        return self.passed


def stop_faulty(running: Iterable[RunningTrial], kill_grace_s: float) -> None:
    """Stop the children whose bytes broke the protocol (SIGKILL at once: the state of their
    process is unknown) and those whose trial another orchestrator finished (SIGTERM)."""
    now = time.monotonic()
    for rt in running:
        if rt.stop_reason is not None:
            continue
        if rt.protocol_error is not None:
            rt.stop_reason = "protocol"
            signal_tree(rt.process.pid, signal.SIGKILL)
        elif rt.reaped:
            rt.stop_reason = "reaped"
            signal_tree(rt.process.pid, signal.SIGTERM)
            rt.kill_at = now + kill_grace_s


def enforce_deadlines(running: Iterable[RunningTrial], timeout_s: float | None,
                      kill_grace_s: float) -> None:
    """SIGTERM a trial past its timeout (paused time left out); SIGKILL past its grace."""
    now = time.monotonic()
    for rt in running:
        running_s = now - rt.spawned_at - rt.paused_s
        # a trial whose result is in has ended, whatever its process still does (a fresh
        # child waits a while for threads the objective left: worker/_child.py, _leave)
        if rt.stop_reason is None and rt.outcome is None and timeout_s is not None \
                and running_s > timeout_s:
            rt.stop_reason = "timeout"
            rt.timed_out_epoch = rt.spawned_epoch + running_s
            if rt.in_setup:  # its worker's start-up counts: it began with the trial's clock
                rt.stop_error = (" with objective.setup still running (the worker's start-up "
                                 "counts against it)")
            signal_tree(rt.process.pid, signal.SIGTERM)
            rt.kill_at = now + kill_grace_s
        if rt.kill_at is not None and now >= rt.kill_at:
            signal_tree(rt.process.pid, signal.SIGKILL)
