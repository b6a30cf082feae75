"""``pruner.patience_mode=reach`` (pruners/_reach.py): patience and Hyperband as under ``veto``,
and a trial stopped at Hyperband's rungs (before the last step) where, even gaining from its
step to its end as much as the complete trial that gained most from that step, it would end
worse than the study's best by more than ``min_delta``; judged only on MIN_COMPLETE complete
curves.

The patient pruner here wraps Optuna's ThresholdPruner: far above every curve it never stops
one, so what is stopped is the rule's; near them it stands for Hyperband's verdict on a
stalled curve, which the rule leaves as it was.
"""

from __future__ import annotations

import math

import optuna
import pytest

from hpo_orchestrator.config import PatientHyperbandPrunerConfig
from hpo_orchestrator.pruners import OutOfReachPruner, out_of_reach
from hpo_orchestrator.pruners._reach import MIN_COMPLETE
from tests.pruners.test_delayed_verdict import STEPS, _run, _study


def _reach(min_resource: int = 3, min_delta: float = 0.0, upper: float = 100.0,
           patience: int = 3, reduction_factor: int = 3) -> OutOfReachPruner:
    patient = optuna.pruners.PatientPruner(optuna.pruners.ThresholdPruner(upper=upper), patience)
    return OutOfReachPruner(patient, min_resource, min_delta, reduction_factor)


def _peers(study: optuna.Study, count: int = MIN_COMPLETE) -> None:
    """Complete trials 0.5 + 0.3 / step (a little apart): each gains 0.07 from step 3 to its
    end at step 10; the best ends at 0.53."""
    for i in range(count):
        assert _run(study, [0.5 + 0.01 * i + 0.3 / s for s in range(1, STEPS + 1)]) is None


def _falling(level: float) -> list[float]:
    return [level + 0.3 / s for s in range(1, STEPS + 1)]


def test_a_falling_trial_that_cannot_reach_the_best_is_stopped_at_min_resource() -> None:
    study = _study(_reach())
    _peers(study)
    # 0.85 at step 3, at best 0.78 at its end: worse than 0.53, though it never stops falling
    assert _run(study, _falling(0.75)) == 3
    # one that gains the peers' 0.07 and ends at the best's 0.53 is not worse: it goes on
    assert _run(study, _falling(0.53 - 0.03)) is None


def test_the_largest_gain_any_complete_trial_made_keeps_a_trial_going() -> None:
    study = _study(_reach())
    # a slow starter: 0.75 at step 3, 0.40 at its end (a gain of 0.35, the best now 0.40)
    assert _run(study, [0.9 - 0.05 * s for s in range(1, STEPS + 1)]) is None
    _peers(study, MIN_COMPLETE - 1)
    assert _run(study, _falling(0.75)) == 3  # 0.85 - 0.35 = 0.50, still short of 0.40
    # 0.70 at step 3: the slow starter's 0.35 on from there would reach 0.40; at the next
    # rung, 9, its 0.05 from 0.633 would not, and the trial is stopped there
    assert _run(study, _falling(0.6)) == 9


def test_fewer_complete_curves_than_the_minimum_judge_nothing() -> None:
    study = _study(_reach())
    _peers(study, MIN_COMPLETE - 1)
    assert _run(study, _falling(5.0)) is None
    assert _run(study, _falling(0.5)) is None  # the fifth complete curve
    assert _run(study, _falling(5.0)) == 3


def test_never_before_min_resource_nor_past_the_steps_complete_trials_reported() -> None:
    study = _study(_reach(min_resource=5))
    _peers(study)
    assert _run(study, _falling(5.0)) == 5
    longer = study.ask()  # past step 10 no complete trial gained anything known: it goes on
    for step, value in enumerate([5.0 + 0.3 / s for s in range(1, 16)], 1):
        longer.report(value, step)
        if step > STEPS:
            assert not longer.should_prune()


def test_judged_only_at_hyperbands_rungs_and_never_at_the_last_step() -> None:
    """Rungs at min_resource x reduction_factor ** k (3 and 9 here); a trial that asks after
    its last report is not stopped there, where stopping it saves nothing."""
    study = _study(_reach())
    nine = range(1, 10)
    assert _run(study, [0.9 - 0.05 * s for s in nine], ask_last=True) is None  # gains 0.30 from 3
    for i in range(MIN_COMPLETE - 1):
        assert _run(study, [0.5 + 0.01 * i + 0.3 / s for s in nine], ask_last=True) is None
    # 0.66 at step 3, 0.30 on from there reaches the best, 0.45; at 6 (0.61, 0.15 on) it
    # cannot, but 4-8 are no rungs and 9 is the last step the complete trials reached
    assert _run(study, [0.56 + 0.3 / s for s in nine], ask_last=True) is None
    judged = _study(_reach(reduction_factor=2))  # rungs 3 and 6
    assert _run(judged, [0.9 - 0.05 * s for s in nine], ask_last=True) is None
    for i in range(MIN_COMPLETE - 1):
        assert _run(judged, [0.5 + 0.01 * i + 0.3 / s for s in nine], ask_last=True) is None
    assert _run(judged, [0.56 + 0.3 / s for s in nine], ask_last=True) == 6


def test_an_objective_reporting_every_other_step_is_judged_past_each_rung() -> None:
    """Reports at 2, 4, .., 10: the rung at 3 is judged at 4 (its first report past it), as
    Hyperband does; the rung at 9 would be at 10, the last step, where nothing is judged."""
    study = _study(_reach())

    def every_other(level: float) -> int | None:
        trial = study.ask()
        for step in range(2, STEPS + 1, 2):
            trial.report(level + 0.3 / step, step)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return step
        study.tell(trial, level + 0.3 / STEPS)
        return None

    for i in range(MIN_COMPLETE):
        assert every_other(0.5 + 0.01 * i) is None
    assert every_other(5.0) == 4
    assert every_other(0.52) == 4  # 0.595 at 4, 0.045 on from there: 0.55, short of 0.53
    assert every_other(0.49) is None  # 0.565 at 4: 0.52 within reach


def test_min_delta_is_the_margin_a_trial_must_miss_the_best_by() -> None:
    study = _study(_reach(min_delta=0.3))
    _peers(study)
    assert _run(study, _falling(0.75)) is None  # 0.78 misses 0.53 by 0.25 only
    assert _run(study, _falling(0.85)) == 3  # 0.88: by 0.35


@pytest.mark.parametrize("min_delta", [0.0, 0.3])
def test_a_maximized_study_mirrors_it(min_delta: float) -> None:
    patient = optuna.pruners.PatientPruner(optuna.pruners.ThresholdPruner(lower=-100.0), 3)
    study = _study(OutOfReachPruner(patient, 3, min_delta), "maximize")
    for i in range(MIN_COMPLETE):
        assert _run(study, [-v for v in _falling(0.5 + 0.01 * i)]) is None
    # -0.78 at best misses -0.53 by 0.25: out of reach, but within a min_delta of 0.3
    assert _run(study, [-v for v in _falling(0.75)]) == (3 if min_delta == 0.0 else None)
    assert _run(study, [-v for v in _falling(0.5)]) is None


def test_a_min_resource_of_one_judges_a_trials_first_report() -> None:
    study = _study(_reach(min_resource=1))
    _peers(study)
    assert _run(study, _falling(5.0)) == 1


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # Optuna's PatientPruner on NaN reports
def test_patience_and_its_pruner_act_as_under_veto() -> None:
    """A stalled curve above the wrapped pruner's threshold is stopped once its last
    ``patience`` + 1 reports beat none before them (Optuna's PatientPruner), whatever its
    reach; NaN is left to them too."""
    study = _study(_reach(upper=1.0, patience=2))
    assert _run(study, [3.0, 2.0, 1.5, 1.6, 1.6, 1.6, 1.0, 0.9, 0.8, 0.7]) == 6
    _peers(study)
    nan = study.ask()
    for step in range(1, 5):
        nan.report(math.nan, step)
        assert not nan.should_prune()


def test_out_of_reach_compares_minimized_values() -> None:
    gains = [0.1] * MIN_COMPLETE
    assert out_of_reach(0.75, gains, 0.6, 0.0)
    assert not out_of_reach(0.7, gains, 0.6, 0.0)  # exactly the best: not worse
    assert not out_of_reach(0.75, gains, 0.6, 0.05)
    assert not out_of_reach(0.75, [*gains[1:], 0.2], 0.6, 0.0)  # the largest gain counts
    assert not out_of_reach(9.0, gains[1:], 0.6, 0.0)


@pytest.mark.parametrize(("min_resource", "expected"), [(3, 3), ("auto", 5)])
def test_the_config_builds_it_over_optunas_patient_hyperband(min_resource: object, expected: int) -> None:
    config = PatientHyperbandPrunerConfig(patience_mode="reach", min_resource=min_resource)
    pruner = config.build(5 if min_resource == "auto" else None)
    assert isinstance(pruner, OutOfReachPruner) and pruner.min_resource == expected
    assert isinstance(pruner.patient, optuna.pruners.PatientPruner)
    assert pruner.min_delta == config.min_delta
    assert pruner.reduction_factor == config.reduction_factor
    # built directly: Hyperband's reduction factor by default, and 1 is a min_resource
    assert OutOfReachPruner(pruner.patient, 1).reduction_factor == 3
    refused = "^min_resource >= 1, min_delta >= 0 and reduction_factor >= 2$"
    for bad in ({"min_resource": 0}, {"min_resource": 3, "min_delta": -0.1},
                {"min_resource": 3, "reduction_factor": 1}):
        with pytest.raises(ValueError, match=refused):
            OutOfReachPruner(pruner.patient, **bad)  # type: ignore[arg-type]


def test_a_trial_is_judged_at_its_best_report_so_far() -> None:
    """An objective that reports raw losses (docs/OBJECTIVES.md asks for the best so far; a
    custom one may not) and returns its best: a trial that already beat the study's best and
    then reported worse could still become the best, and is not stopped."""
    study = _study(_reach())
    _peers(study)  # the best 0.53
    assert _run(study, [0.9, 0.3, 0.95, *[0.9] * (STEPS - 3)]) is None
    # a maximized study alike
    patient = optuna.pruners.PatientPruner(optuna.pruners.ThresholdPruner(lower=-100.0), 3)
    study = _study(OutOfReachPruner(patient, 3), "maximize")
    for i in range(MIN_COMPLETE):
        assert _run(study, [-v for v in _falling(0.5 + 0.01 * i)]) is None
    assert _run(study, [-0.9, -0.3, -0.95, *[-0.9] * (STEPS - 3)]) is None


def test_a_complete_trials_nan_report_is_no_evidence_of_a_gain() -> None:
    study = _study(_reach())
    _peers(study, MIN_COMPLETE - 1)
    nan_at_3 = _falling(0.5)
    nan_at_3[2] = math.nan
    assert _run(study, nan_at_3) is None
    # at step 3 four gains are known, at the next rung, 9, five
    assert _run(study, _falling(5.0)) == 9
