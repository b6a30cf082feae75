"""``pruner.patience_mode=delay``: Hyperband's verdict, carried out ``patience`` steps late.

Why. Under Optuna's PatientPruner (``patience_mode=veto``) Hyperband is asked only once a
trial has gone ``patience`` steps without improving, so a curve that keeps falling is never
judged however far behind it stays: on the CNN of docs/QUALITY.md (workload c) the default
stopped 0-1 trials a run where Optuna's HyperbandPruner stopped 10-51, and on reports of the
best value so far (docs/OBJECTIVES.md), which never rise, PatientPruner never lets Hyperband
speak at all.

The rule. Hyperband (Optuna's ``HyperbandPruner``, unchanged) judges the trial at every report,
so each rung is recorded at its own step with that step's value, as Hyperband alone records
it. When it first says prune, at step ``v``, the verdict stands: the trial is stopped at its
first report at step ``v + patience`` or later, or sooner at the first report at which it has
gone ``patience`` reports without improving on its best by more than ``min_delta`` (it has
stopped learning: waiting buys nothing). A verdict late in a trial is carried out by the step
before the last one a complete trial reached (say step 9 of 10), not let off because the trial
ends first. Patience delays the verdict; it never vetoes it.

One way out: at that first report at or after its deadline, a trial whose value there is
among the best 1/``reduction_factor`` of the values that every trial which reported that same
step had there (itself included, running trials too, failed ones not; NaN never goes on) has
caught up, and goes on; Hyperband judges it again from its next rung. Values compared at one
step, never a later step of one trial against an earlier step of another: a curve that keeps
falling would otherwise always look as good as its rivals did ``patience`` steps before. A
trial alone at that step goes on (nothing to compare it with).

Where the verdict is kept: the step of it, in the trial's system attrs (:data:`VERDICT`), where
Optuna's successive halving keeps its rungs, so every orchestrator of the study sees it.

TPE: this pruner is not an instance of ``HyperbandPruner``, so Optuna does not split TPE's
history by Hyperband's brackets (``optuna.pruners._filter_study``), as under PatientPruner: the
sampler learns from every trial, where under Hyperband alone each bracket's TPE starts again
with its own ``n_startup_trials`` random ones.
"""

from __future__ import annotations

import math

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from hpo_orchestrator.pruners._ranked import goes_on

__all__ = ["VERDICT", "DelayedVerdictPruner", "improving"]

# The system attr holding the step of Hyperband's pending verdict (absent or None: none)
VERDICT = "patient_hyperband:verdict_step"


def improving(values: list[float], patience: int, min_delta: float) -> bool:
    """Whether the last ``patience`` of ``values`` (minimized, in step order) beat the best
    before them by more than ``min_delta``; True while there are ``patience`` or fewer."""
    if len(values) <= patience:
        return True
    before = min(values[:-patience], default=math.inf)
    return min(values[-patience:]) < before - min_delta


class DelayedVerdictPruner(optuna.pruners.BasePruner):
    """Optuna's pruner for the rule of the module doc, over ``hyperband``."""

    def __init__(self, hyperband: optuna.pruners.BasePruner, patience: int, min_delta: float = 0.0,
                 reduction_factor: int = 3) -> None:
        if patience < 0 or min_delta < 0 or reduction_factor < 2:
            raise ValueError("patience >= 0, min_delta >= 0 and reduction_factor >= 2")
        self.hyperband = hyperband
        self.patience = patience
        self.min_delta = min_delta
        self.reduction_factor = reduction_factor

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        verdict = trial.system_attrs.get(VERDICT)
        if verdict is None:
            if not self.hyperband.prune(study, trial):
                return False
            if self.patience == 0:
                return True
            verdict = step
            study._storage.set_trial_system_attr(trial._trial_id, VERDICT, step)
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
        value = sign * trial.intermediate_values[step]
        if math.isnan(value):
            return True
        curve = [sign * trial.intermediate_values[s] for s in sorted(trial.intermediate_values)]
        if not improving([math.inf if math.isnan(v) else v for v in curve], self.patience,
                         self.min_delta):
            return True
        if step < self._deadline(study, verdict):
            return False
        if self._caught_up(study, trial, step, value, sign):
            study._storage.set_trial_system_attr(trial._trial_id, VERDICT, None)
            return False
        return True

    def _deadline(self, study: optuna.Study, verdict: int) -> int:
        """``patience`` steps after the verdict, but not past the last step before the end
        (the longest complete trial's last step): a verdict that comes late is not let off
        because the trial ends first."""
        full = max((t.last_step for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.last_step is not None), default=None)
        deadline = verdict + self.patience
        return deadline if full is None else max(verdict, min(deadline, full - 1))

    def _caught_up(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, step: int,
                   value: float, sign: float) -> bool:
        rivals = [sign * t.intermediate_values[step] for t in study.get_trials(deepcopy=False)
                  if t.number != trial.number and t.state != TrialState.FAIL
                  and step in t.intermediate_values]
        values = sorted(math.inf if math.isnan(v) else v for v in [*rivals, value])
        return goes_on(values, value, self.reduction_factor)
