"""``pruner.patience_mode=reach``: patience holds Hyperband back only while a trial can still
reach the study's best value.

Why. Under Optuna's PatientPruner (``patience_mode=veto``) a curve that keeps falling is never
judged, however far behind it stays (docs/DESIGN.md §3.13). ``delay`` carries out every
verdict of Hyperband some steps late; in paired real runs it pruned many trials on LightGBM's
curves (workload a) and ended worse (docs/quality/runs.md). This rule stops only the trials
that the study's own curves say cannot matter.

The rule. Patience and Hyperband act as under ``veto``, unchanged. Besides, at Hyperband's
rungs (a trial's first report at or past step ``min_resource`` x ``reduction_factor`` ** k),
a trial is stopped at a report at step ``s`` where, even if it gained from ``s`` to its end
as much as the complete trial that gained most from its own report at ``s`` to its value, it
would still end worse than the study's best value by more than ``min_delta``. Gains are read from at least
:data:`MIN_COMPLETE` complete trials that reported step ``s``; with fewer, or none so far at
that step, nothing is stopped by it. Taking the largest gain any of them made keeps the rule
optimistic for the trial: curves of another shape (a small learning rate, say) that gained
more late keep every trial they could stand for.

Why only at the rungs: each judgement reads every complete trial, so judging every report
would cost each trial its reports times the study's size (milliseconds a report at 5,000
trials); at the rungs it is two or three judgements a trial, early enough to save most of
its steps. Never at or past the last step a complete trial reported: stopping a trial there
saves nothing, and it would be marked pruned where it completes (Optuna's examples ask after
their last report too), so the evidence of complete curves would stop growing.

The value compared is the one the objective reports; the objectives of this project report
the best so far (docs/OBJECTIVES.md), so a gain is never negative. The trial is judged at its
best report so far: on such reports its latest; on raw ones a trial that already beat the
study's best and then reported worse is not stopped (it may return that best). NaN reports
are left to patience and Hyperband; a complete trial's NaN report at ``s`` is no evidence of
a gain.
"""

from __future__ import annotations

import math

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

__all__ = ["MIN_COMPLETE", "OutOfReachPruner", "out_of_reach"]

# Complete trials whose gains from a step must be known before a trial is judged out of reach
# there: fewer curves say too little of how much a trial may still gain.
MIN_COMPLETE = 5


def out_of_reach(value: float, gains: list[float], best: float, min_delta: float) -> bool:
    """Whether a trial at ``value`` (minimized) ends worse than ``best`` by more than
    ``min_delta`` even after the largest of ``gains``; never with fewer than MIN_COMPLETE."""
    if len(gains) < MIN_COMPLETE:
        return False
    return value - max(gains) > best + min_delta


class OutOfReachPruner(optuna.pruners.BasePruner):
    """``patient`` (Optuna's PatientPruner over Hyperband) plus the rule of the module doc."""

    def __init__(self, patient: optuna.pruners.BasePruner, min_resource: int,
                 min_delta: float = 0.0, reduction_factor: int = 3) -> None:
        if min_resource < 1 or min_delta < 0 or reduction_factor < 2:
            raise ValueError("min_resource >= 1, min_delta >= 0 and reduction_factor >= 2")
        self.patient = patient
        self.min_resource = min_resource
        self.min_delta = min_delta
        self.reduction_factor = reduction_factor

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if self.patient.prune(study, trial):
            return True
        step = trial.last_step
        if step is None or not self.crosses_rung(step, trial.intermediate_values):
            return False
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
        if math.isnan(trial.intermediate_values[step]):
            return False
        # its best report so far: the same value on best-so-far reports; on raw ones a trial
        # that already beat the best, then reported worse, may still return that best
        value = min(sign * v for v in trial.intermediate_values.values() if not math.isnan(v))
        gains, best, end = [], math.inf, 0
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.value is None or math.isnan(t.value):
                continue
            best = min(best, sign * t.value)
            end = max(end, t.last_step or 0)
            at = t.intermediate_values.get(step)
            if at is not None and not math.isnan(at):
                gains.append(sign * at - sign * t.value)
        return step < end and out_of_reach(value, gains, best, self.min_delta)

    def crosses_rung(self, step: int, reported: dict[int, float]) -> bool:
        """Whether the report at ``step`` is a trial's first at or past one of Hyperband's
        rungs (min_resource x reduction_factor ** k), as Hyperband judges a rung: an
        objective that reports every other step is judged at 4 for the rung at 3."""
        before = max((s for s in reported if s < step), default=-1)
        rung = self.min_resource
        while rung <= before:
            rung *= self.reduction_factor
        return rung <= step
