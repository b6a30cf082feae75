"""``pruner.min_resource=auto``: let each trial train long enough to pay for its start.

A trial's time until step ``s`` is modelled as ``overhead_s + step_s * s``, fitted to the
times of its reports (so ``overhead_s`` holds process start, imports, data loading: whatever
comes before the steps). Its first pruning decision comes at ``min_resource``; start-up is at
most ``share`` of the device time until then when

    overhead_s / (overhead_s + step_s * min_resource) <= share
    <=> min_resource >= overhead_s * (1 - share) / (share * step_s)

The orchestrator feeds every finished trial's fit to :class:`AutoMinResource`, which answers
with a new value when the medians move it, and the pruner is rebuilt with that value. Until a
first trial has been measured nothing is pruned (there is nothing to base a value on).

A new min_resource changes Hyperband's rungs and bracket count mid-study: trials judged
before the change were judged on the old rungs. The value moves only when the medians do, so
it settles after the first trials; each orchestrator of a study chooses its own value (the
study attr holds the last one written).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from hpo_orchestrator import keys
from hpo_orchestrator.config import PatientHyperbandPrunerConfig, PrunerConfig
from hpo_orchestrator.db import max_completed_step, step_timings
from hpo_orchestrator.pruning._factory import build_pruner

if TYPE_CHECKING:
    import optuna

__all__ = ["AutoMinResource", "AutoPruner", "StepTiming", "fit_step_timing", "min_resource_for",
           "stored_timings"]


@dataclass(frozen=True)
class StepTiming:
    overhead_s: float
    step_s: float  # seconds per step unit


def fit_step_timing(reports: list[tuple[int, float]], startup_s: float | None) -> StepTiming | None:
    """From (step, seconds since spawn) of a trial's reports. Two or more reports: the line
    through the first and the last. One: start-up is the overhead, the rest is that step."""
    if not reports:
        return None
    (first_step, first_t), (last_step, last_t) = reports[0], reports[-1]
    if last_step > first_step:
        step_s = (last_t - first_t) / (last_step - first_step)
        return StepTiming(max(0.0, first_t - step_s * first_step), max(step_s, 0.0))
    overhead = min(startup_s or 0.0, first_t)
    return StepTiming(overhead, (first_t - overhead) / max(first_step, 1))


def stored_timings(connection: Connection, study_id: int, first: int = 0) -> dict[int, StepTiming]:
    """trial_id -> the fit the orchestrator recorded (attrs hpo.overhead_s, hpo.step_s), for
    the trials from number ``first`` on."""
    return {trial_id: StepTiming(overhead, step)
            for trial_id, (overhead, step) in step_timings(connection, study_id, first).items()}


def min_resource_for(overhead_s: float, step_s: float, share: float,
                     max_step: int | None) -> int:
    """The smallest min_resource that keeps start-up at most ``share``, within [1, max_step]."""
    if step_s <= 0:
        wanted = max_step or 1
    else:
        wanted = math.ceil(overhead_s * (1 - share) / (share * step_s) - 1e-9)
    if max_step is not None:
        wanted = min(wanted, max_step)  # Hyperband needs min_resource <= max_resource
    return max(1, wanted)


@dataclass
class AutoMinResource:
    """The current choice and what it rests on (single-threaded: the orchestrator's loop)."""

    share: float
    timings: list[StepTiming] = field(default_factory=list)
    max_step: int | None = None  # the last step a completed trial reached
    value: int | None = None
    history: list[list[int | None]] = field(default_factory=list)  # [at trial, value] per change

    def add(self, timing: StepTiming | None, completed_step: int | None = None,
            at_trial: int | None = None) -> bool:
        """Take one trial's measurements; True when min_resource changed (the change is kept in
        ``history`` with ``at_trial``)."""
        if timing is not None:
            self.timings.append(timing)
        if completed_step is not None:
            self.max_step = max(self.max_step or 0, completed_step)
        if not self.timings:
            return False
        overhead, step = self.medians()
        chosen = min_resource_for(overhead, step, self.share, self.max_step)
        changed = chosen != self.value
        self.value = chosen
        if changed:
            self.history.append([at_trial, chosen])
        return changed

    def medians(self) -> tuple[float, float]:
        return (statistics.median(t.overhead_s for t in self.timings),
                statistics.median(t.step_s for t in self.timings))

    def record(self) -> dict[str, Any]:
        """The study attr ``hpo.pruner.min_resource_auto``: the value and why."""
        overhead, step = self.medians()
        share_now = overhead / (overhead + step * (self.value or 1)) if overhead + step > 0 else 0.0
        reason = (f"start-up and set-up take {overhead:.2f} s and a step {step:.3f} s (medians of "
                  f"{len(self.timings)} trials): min_resource={self.value} keeps start-up at "
                  f"{share_now:.0%} of a trial's time before its first pruning decision "
                  f"(pruner.startup_share={self.share})")
        if self.max_step is not None and self.value == self.max_step and share_now > self.share:
            reason += f"; capped at the last step a completed trial reached ({self.max_step})"
        return {"min_resource": self.value, "reason": reason, "overhead_s": round(overhead, 4),
                "step_s": round(step, 5), "startup_share": self.share,
                "measured_trials": len(self.timings), "max_step": self.max_step,
                "at_trial": self.history[-1][0] if self.history else None,
                "history": self.history[-50:]}


class AutoPruner:
    """``pruner.min_resource=auto`` applied to a live study: each change rebuilds the study's
    pruner and records the value and why in the study attr ``hpo.pruner.min_resource_auto``.

    Trials already running are judged by the new pruner from their next report on
    (``trial.should_prune`` asks ``study.pruner``). Single-threaded: the orchestrator's loop.
    """

    def __init__(self, study: optuna.Study, config: PatientHyperbandPrunerConfig) -> None:
        self.study = study
        self.config = config
        fixed_max = config.max_resource if isinstance(config.max_resource, int) else None
        self.choice = AutoMinResource(config.startup_share, max_step=fixed_max)

    @classmethod
    def for_config(cls, study: optuna.Study, config: PrunerConfig) -> AutoPruner | None:
        """One when the config asks for min_resource=auto, else None."""
        if isinstance(config, PatientHyperbandPrunerConfig) and config.min_resource == "auto":
            return cls(study, config)
        return None

    def seed(self, engine: Engine) -> None:
        """On a study that already has measured trials (a restart, a second host): start from
        their timings instead of from nothing."""
        with engine.connect() as connection:
            timings = stored_timings(connection, self.study._study_id)
            completed_step = max_completed_step(connection, self.study._study_id)
        self.choice.max_step = max(self.choice.max_step or 0, completed_step or 0) or None
        changed = False
        for timing in timings.values():
            changed |= self.choice.add(timing)
        if changed:
            self._apply()

    def observe(self, number: int, measured: dict[str, Any], completed_step: int | None) -> None:
        """A finished trial's measured attrs (hpo.overhead_s, hpo.step_s) and, when it
        completed, the last step it reached."""
        if keys.STEP_S not in measured:
            return
        timing = StepTiming(measured[keys.OVERHEAD_S], measured[keys.STEP_S])
        if self.choice.add(timing, completed_step, at_trial=number):
            self._apply()

    def _apply(self) -> None:
        assert self.choice.value is not None
        self.study.pruner = build_pruner(self.config, self.choice.value)
        self.study.set_user_attr(keys.PRUNER_MIN_RESOURCE_AUTO, self.choice.record())
