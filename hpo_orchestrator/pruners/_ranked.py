"""``pruner=ranked_halving``: successive halving whose rungs the study's own ranks choose.

Why. PatientPruner(Hyperband) (the default before ``patience_mode=reach``; ``veto`` now)
lets Hyperband stop a trial only after
``patience`` steps without improvement; on curves that keep improving (the CNN of
docs/QUALITY.md, workload c) that hardly ever happens, so it stopped 14 % of the trials where
Hyperband alone stopped 79 %. Hyperband alone prunes from step 1, and on LightGBM's curves
(workload a), whose ranks cross late (slow learning rates end best), it ended behind no
pruner. Whether a trial's rank early on says how it ends is what decides, and the study
measures that itself.

The rule. A ladder is a first rung ``m`` and a reduction factor ``r``: rungs at m, m*r,
m*r^2, ... below the trials' full length. At a rung a trial goes on only if its value there is
among the best 1/r of the values there of every trial that reached it, itself and running
ones included (the promotion rule of Optuna's SuccessiveHalvingPruner). The ladder in force
is the cheapest one (fewest expected steps per trial) under which each of the ``protect``
best trials of the evidence would have gone on at every rung, ranked against the evidence's
values at that rung's step. Curves whose early ranks hold get an early first rung (many
configurations looked at); curves that cross, a late one; none while the best trail to the
end (no pruning, as with no pruner). Nothing is pruned before ``min_complete`` trials of
evidence.

The evidence: the complete trials that no rung judged. A trial that survived a cut is no
evidence for that cut: the trials it pruned never show how they would have ended, so the
survivors' ranks hold by selection, and a ladder chosen from them creeps earlier and earlier
(in the simulation of workload a it went from a first rung at step 17 of 20 to step 1 within
forty trials). So a trial that faces a rung is marked (the system attr ``JUDGED``, as Optuna's
successive halving keeps its ``completed_rung_i`` there, shared by every orchestrator of the
study), and every ``audit_every``-th trial (by number) is never judged: it runs to the end
and keeps the evidence growing, an unbiased sample of what the sampler proposes. The ladder
is chosen again whenever the evidence grows.

A decision compares the values at the rung's own step, read from the trials' intermediate
values (Optuna's pruner compares the values it recorded when each trial reached a rung), so
a ladder that changes during the study still compares trials at the same step. A trial that
did not report the rung's step is not judged there.

Thread safety: the ladder is cached on the pruner and re-chosen in ``prune``; the
orchestrator asks from one thread (scheduler/_calls.py). Built by its config
(``RankedHalvingPrunerConfig.build``) when a run uses it (it imports Optuna).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

__all__ = ["JUDGED", "Ladder", "RankedHalvingPruner", "choose_ladder", "goes_on"]

# The system attr of a trial that faced a rung (as Optuna's successive halving keeps
# completed_rung_i there): such a trial survived a cut, so its curve is no evidence for one.
JUDGED = "ranked_halving:judged"


@dataclass(frozen=True)
class Ladder:
    first: int  # the first rung's step (min_resource)
    factor: int  # reduction factor: 1/factor of the trials at a rung go on
    rungs: tuple[int, ...]
    expected_steps: float  # per trial, if every rung keeps exactly 1/factor

    @classmethod
    def of(cls, first: int, factor: int, full: int) -> Ladder:
        rungs: list[int] = []
        step = first
        while step < full:
            rungs.append(step)
            step *= factor
        cost, last, share = 0.0, 0, 1.0
        for rung in (*rungs, full):
            cost += (rung - last) * share
            last, share = rung, share / factor
        return cls(first, factor, tuple(rungs), cost)


def goes_on(sorted_values: Sequence[float], value: float, factor: int) -> bool:
    """Whether ``value`` is among the best 1/factor of ``sorted_values`` (ascending, itself
    included; minimized, NaN given as inf, which never goes on): Optuna's
    SuccessiveHalvingPruner rule, the best alone going on while fewer than ``factor`` trials
    reached the rung."""
    return value < math.inf and value <= sorted_values[max(len(sorted_values) // factor - 1, 0)]


def choose_ladder(curves: Sequence[dict[int, float]], finals: Sequence[float],
                  factors: Sequence[int], protect: int, min_complete: int) -> Ladder | None:
    """The cheapest ladder that keeps the ``protect`` best of the evidence (module doc).

    ``curves``, ``finals``: the unjudged complete trials' intermediate values (step -> value)
    and values, minimized (negated for a maximized study, NaN given as inf)."""
    if len(curves) < max(min_complete, 1):
        return None
    full = max(max(curve) for curve in curves if curve)
    best = sorted(range(len(curves)), key=lambda i: finals[i])[:protect]
    at_step: dict[int, list[float]] = {}
    for curve in curves:
        for step, value in curve.items():
            at_step.setdefault(step, []).append(value)
    for values in at_step.values():
        values.sort()

    def keeps(step: int, factor: int) -> bool:
        return all(step in curves[i] and goes_on(at_step[step], curves[i][step], factor) for i in best)

    ladders = [Ladder.of(first, factor, full) for factor in factors for first in range(1, full)]
    kept = [ladder for ladder in ladders
            if ladder.rungs and all(keeps(step, ladder.factor) for step in ladder.rungs)]
    # the cheapest; of equal cost the later first rung (the gentler ladder)
    return min(kept, key=lambda lad: (lad.expected_steps, -lad.first), default=None)


class RankedHalvingPruner(optuna.pruners.BasePruner):
    """Optuna's pruner for the rule of the module doc."""

    def __init__(self, reduction_factors: Sequence[int] = (3,), protect: int = 3,
                 min_complete: int = 10, audit_every: int = 5) -> None:
        self.reduction_factors = tuple(reduction_factors)
        self.protect = protect
        self.min_complete = min_complete
        self.audit_every = audit_every
        self.ladder: Ladder | None = None
        self._evidence_seen = -1

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
        trials = study.get_trials(deepcopy=False)
        evidence = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None
                    and JUDGED not in t.system_attrs and t.intermediate_values]
        if len(evidence) != self._evidence_seen:
            self._evidence_seen = len(evidence)
            self.ladder = choose_ladder(
                [{s: _minimized(sign * v) for s, v in t.intermediate_values.items()} for t in evidence],
                [_minimized(sign * t.value) for t in evidence],  # type: ignore[operator]
                self.reduction_factors, self.protect, self.min_complete)
        if self.ladder is None or step not in self.ladder.rungs:
            return False
        if self.audit_every and trial.number % self.audit_every == 0:
            return False
        if JUDGED not in trial.system_attrs:
            study._storage.set_trial_system_attr(trial._trial_id, JUDGED, True)
        value = _minimized(sign * trial.intermediate_values[step])
        values = sorted([_minimized(sign * t.intermediate_values[step]) for t in trials
                         if t.number != trial.number and step in t.intermediate_values
                         and t.state != TrialState.FAIL] + [value])
        return not goes_on(values, value, self.ladder.factor)


def _minimized(value: float) -> float:
    """NaN as the worst value: it never goes on (as in Optuna's pruners)."""
    return math.inf if math.isnan(value) else value
