"""How a trial ended, and what follows from it: pure rules, no processes, no storage.

The loop gathers the facts (what it did to the child, what the child said, how its process
ended) and these functions decide: the state and ``hpo.fail_reason`` to record
(docs/DESIGN.md §2.3 lists the reasons), whether the params run again, whether a reuse worker
runs the slot's next trial.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState

from hpo_orchestrator.worker import TrialOutcome

__all__ = ["RERUN_AS_IS", "RETRYABLE", "Verdict", "classify", "keep_worker", "params_mismatch",
           "retry_allowed", "retry_attempt"]

RETRYABLE = ("oom", "killed", "lost")  # failures that were not the objective's fault
# Not the trial's failure at all: its params run again under the same attempt (a full disk
# stops the run, as Ctrl-C does; the same command resumes once there is room).
RERUN_AS_IS = ("interrupted", "disk_full")


@dataclass(frozen=True)
class Verdict:
    state: TrialState
    value: float | tuple[float, ...] | None = None  # a tuple: one per objective (several)
    fail_reason: str | None = None  # absent when the trial did not fail
    error: str | None = None


def _valued(value: float | tuple[float, ...] | None, directions: tuple[str, ...]) -> Verdict:
    """COMPLETE with one value per direction; any other count fails the trial (the objective's
    mistake, told as such rather than as Optuna's ValueError at tell)."""
    values = value if isinstance(value, tuple) else (value,)
    if len(values) != len(directions):
        returned = f"{len(values)} value{'s' if len(values) != 1 else ''}"
        return Verdict(TrialState.FAIL, None, "exception",
                       f"ValueError: objective returned {returned}; the study has "
                       f"{len(directions)} objective(s) ({', '.join(directions)}): return one "
                       f"number per direction")
    return Verdict(TrialState.COMPLETE, values if len(values) > 1 else values[0])


def classify(*, stop_reason: str | None, outcome: TrialOutcome | None, returncode: int | None,
             timeout_s: float | None, oom_killed: Callable[[], bool],
             log_tail: Callable[[], str], protocol_error: str | None = None,
             stop_error: str | None = None,
             directions: tuple[str, ...] = ("minimize",)) -> Verdict:
    """The verdict from what we did (``stop_reason``: timeout / interrupted / study_timeout),
    what the child said (``outcome``; ``protocol_error`` when its bytes broke the protocol:
    the objective's fault, whatever it said before) and how its process ended
    (``returncode``, None while it lives). ``stop_error``: why an interrupted trial was
    stopped when not by a signal (the failure policy), or what a timed-out trial was doing.

    ``oom_killed`` (did the kernel's OOM killer act since the spawn?) and ``log_tail`` (the
    last line the child printed) are asked only for a child that died without a result.
    ``directions``: the study's, one per value the objective must return.
    """
    if stop_reason == "timeout":
        return Verdict(TrialState.FAIL, None, "timeout",
                       f"ran past scheduler.trial_timeout_s={timeout_s}{stop_error or ''}")
    if protocol_error is not None:
        return Verdict(TrialState.FAIL, None, "exception", protocol_error)
    if outcome is not None and outcome.kind == "value":
        return _valued(outcome.value, directions)
    if outcome is not None and outcome.kind == "pruned":
        return Verdict(TrialState.PRUNED)
    if stop_reason == "interrupted":
        return Verdict(TrialState.FAIL, None, "interrupted",
                       stop_error or "stopped by SIGINT/SIGTERM/SIGHUP")
    if stop_reason == "study_timeout":
        return Verdict(TrialState.FAIL, None, "timeout",
                       "still running study.timeout_grace_s after study.timeout_s")
    if outcome is not None:
        return Verdict(TrialState.FAIL, None, outcome.fail_reason, outcome.error)
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode)
        if sig == signal.SIGKILL and oom_killed():
            return Verdict(TrialState.FAIL, None, "oom", "killed by the kernel OOM killer")
        detail = log_tail()
        return Verdict(TrialState.FAIL, None, "killed",
                       f"died by {sig.name}" + (f": {detail}" if detail else ""))
    detail = log_tail() or "no result"
    if detail == "KeyboardInterrupt":
        # Python's last line for an uncaught KeyboardInterrupt. The child reports one that the
        # objective (or its setup) raised as its failure, so an uncaught one is a SIGINT sent
        # from outside, e.g. while the child was still importing, before its own handler.
        return Verdict(TrialState.FAIL, None, "killed",
                       f"died by SIGINT (exit code {returncode}, before the objective ran)")
    return Verdict(TrialState.FAIL, None, "exception", f"exited with code {returncode}: {detail}")


def retry_allowed(reason: str | None, attempt: int, max_retries: int) -> bool:
    """Run the same params again? Only after a failure that was not the objective's fault."""
    return reason in RETRYABLE and attempt <= max_retries


def retry_attempt(reason: str | None, attempt: int, max_retries: int) -> int | None:
    """The ``hpo.attempt`` of the trial's retry, or None when its params do not run again.

    An interrupted trial (its orchestrator was stopped) always runs again, first in
    the next run, under the same attempt number: stopping a run is not the trial's failure
    and must not use up its retries. So does one
    whose disk was full: the file system refused a write, the objective did nothing wrong.
    """
    if reason in RERUN_AS_IS:
        return attempt
    return attempt + 1 if retry_allowed(reason, attempt, max_retries) else None


def keep_worker(*, reuse: bool, alive: bool, connection_open: bool, stopping: bool,
                state: TrialState, trials_run: int, max_trials: int) -> bool:
    """Does a reuse worker run its slot's next trial? Not after a failure (its state may be
    broken), nor once it has run ``max_trials`` (scheduler.max_trials_per_worker)."""
    return (reuse and alive and connection_open and not stopping
            and state in (TrialState.COMPLETE, TrialState.PRUNED) and trials_run < max_trials)


def params_mismatch(suggested: dict[str, Any], effective: dict[str, Any]) -> dict[str, list[Any]]:
    """Suggested params the library ran with another value: {name: [suggested, effective]}.

    Only names present in both are compared (libraries add many defaults of their own);
    numbers compare with a relative tolerance, since libraries round-trip floats as text
    (LightGBM's model dump keeps 6 significant digits).
    """
    differing = {}
    for name, wanted in suggested.items():
        if name not in effective:
            continue
        got = effective[name]
        if isinstance(wanted, (int, float)) and isinstance(got, (int, float)) \
                and not isinstance(wanted, bool) and not isinstance(got, bool):
            same = math.isclose(float(wanted), float(got), rel_tol=1e-4, abs_tol=1e-12)
        else:
            same = wanted == got
        if not same:
            differing[name] = [wanted, got]
    return differing
