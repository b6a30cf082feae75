"""``pruner.min_resource=auto`` (pruning/_auto.py) from its promises: the study attr
``hpo.pruner.min_resource_auto`` says the value and why in numbers (start-up's share at that
value, the cap at the last completed step when the share could not be kept), and the live
study's pruner is rebuilt with each new value, from a finished trial's measured attrs or, on a
restart, from the timings the study already holds. Written for the mutants mutmut found
unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator import keys
from hpo_orchestrator.config import HyperbandPrunerConfig, PatientHyperbandPrunerConfig
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.pruning import AutoPruner, fit_step_timing
from hpo_orchestrator.pruning._auto import AutoMinResource, StepTiming, min_resource_for


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _reason(overhead: str, step: str, trials: int, value: int, share_now: str,
            share: float = 0.25) -> str:
    return (f"start-up and set-up take {overhead} s and a step {step} s (medians of {trials} "
            f"trials): min_resource={value} keeps start-up at {share_now} of a trial's time "
            f"before its first pruning decision (pruner.startup_share={share})")


def test_the_record_says_the_value_and_why_in_numbers() -> None:
    """30.123456 s of start-up, 10.1234567 s a step: min_resource=9 keeps start-up at 25 %;
    the medians kept to 4 and 5 decimals."""
    auto = AutoMinResource(share=0.25)
    assert auto.add(StepTiming(30.123456, 10.1234567), completed_step=20, at_trial=4)
    assert auto.record() == {
        "min_resource": 9, "reason": _reason("30.12", "10.123", 1, 9, "25%"),
        "overhead_s": 30.1235, "step_s": 10.12346, "startup_share": 0.25, "measured_trials": 1,
        "max_step": 20, "at_trial": 4, "history": [[4, 9]]}


@pytest.mark.parametrize(("timing", "max_step", "value", "share_now", "capped"), [
    (StepTiming(60.0, 1.0), 20, 20, "75%", True),  # 180 steps wanted, 20 the last completed
    (StepTiming(30.0, 10.0), 9, 9, "25%", False),  # at the cap, and the share kept exactly
    (StepTiming(1.0, 10.0), None, 1, "9%", False),  # a start-up cheaper than a step
    (StepTiming(0.3, 0.5), None, 2, "23%", False),  # both under a second together
    (StepTiming(0.0, 0.0), None, 1, "0%", False),  # nothing measurable
])
def test_the_record_says_when_the_share_could_not_be_kept(timing: StepTiming, max_step: int | None,
                                                          value: int, share_now: str,
                                                          capped: bool) -> None:
    auto = AutoMinResource(share=0.25, max_step=max_step)
    auto.add(timing)
    record = auto.record()
    assert record["min_resource"] == value
    cap = f"; capped at the last step a completed trial reached ({max_step})" if capped else ""
    assert record["reason"] == _reason(f"{timing.overhead_s:.2f}", f"{timing.step_s:.3f}", 1, value,
                                       share_now) + cap


def test_the_history_keeps_the_last_50_changes_and_the_trial_of_the_last() -> None:
    auto = AutoMinResource(share=0.25)
    for number in range(60):  # each a new median: a new value each time
        auto.add(StepTiming(30.0 + 10.0 * number, 1.0), at_trial=number)
    record = auto.record()
    assert len(record["history"]) == 50 and record["history"][0] == [10, auto.history[10][1]]
    assert record["at_trial"] == 59 and record["measured_trials"] == 60


def test_a_completed_step_alone_moves_the_cap() -> None:
    """A trial without timings that completed at step 4: the value measured so far (9) is
    capped at 4 from now on, and the change is kept with its trial."""
    auto = AutoMinResource(share=0.25)
    auto.add(StepTiming(30.0, 10.0), completed_step=20, at_trial=1)
    assert auto.add(None, completed_step=4, at_trial=2) is False  # the larger step stays
    assert auto.add(None) is False and auto.value == 9
    low = AutoMinResource(share=0.25, max_step=None)
    low.add(StepTiming(30.0, 10.0), completed_step=4, at_trial=1)
    assert (low.value, low.max_step, low.history) == (4, 4, [[1, 4]])


def test_a_single_report_or_steps_out_of_order_still_fit() -> None:
    """One report at step 3, 8 s after spawn with 2 s of start-up: 2 s overhead, 2 s a step.
    Two reports of one step: the same. A start-up longer than the report's time: all of it
    overhead, no step time. A line that would start before the spawn: no overhead."""
    assert fit_step_timing([(3, 8.0)], startup_s=2.0) == StepTiming(2.0, 2.0)
    assert fit_step_timing([(3, 8.0), (3, 9.0)], startup_s=2.0) == StepTiming(2.0, 2.0)
    assert fit_step_timing([(2, 3.0)], startup_s=5.0) == StepTiming(3.0, 0.0)
    assert fit_step_timing([(0, 3.0)], startup_s=None) == StepTiming(0.0, 3.0)
    assert fit_step_timing([(1, 1.0), (3, 7.0)], startup_s=None) == StepTiming(0.0, 3.0)
    assert fit_step_timing([(2, 5.0), (4, 9.0)], startup_s=None) == StepTiming(1.0, 2.0)


def test_min_resource_within_one_and_the_last_step() -> None:
    zero = AutoMinResource(share=0.25)
    zero.add(StepTiming(30.0, 10.0), completed_step=0)  # Optuna counts steps from 0 too
    assert zero.max_step == 0
    assert min_resource_for(5.0, 0.0, 0.25, None) == 1  # no step time, no cap: one
    assert min_resource_for(5.0, -1.0, 0.25, 7) == 7
    assert min_resource_for(0.0, 1.0, 0.25, 3) == 1


# --- the live study ----------------------------------------------------------------------------

def _config(**kw: object) -> PatientHyperbandPrunerConfig:
    return PatientHyperbandPrunerConfig(**{"min_resource": "auto", "patience_mode": "veto", **kw})


def test_auto_is_taken_only_where_the_config_asks_for_it() -> None:
    study = optuna.create_study()
    made = AutoPruner.for_config(study, _config())
    assert isinstance(made, AutoPruner) and made.study is study
    assert AutoPruner.for_config(study, _config(min_resource=3)) is None
    assert AutoPruner.for_config(study, HyperbandPrunerConfig()) is None
    fixed = AutoPruner(study, _config(max_resource=12, startup_share=0.4))
    assert (fixed.choice.max_step, fixed.choice.share) == (12, 0.4)
    assert AutoPruner(study, _config()).choice.max_step is None  # "auto": no cap known yet


def test_a_finished_trials_timing_rebuilds_the_studys_pruner_and_is_recorded() -> None:
    study = optuna.create_study()
    auto = AutoPruner(study, _config(patience=2))
    auto.observe(0, {keys.OVERHEAD_S: 9.0}, completed_step=12)  # no step time: nothing
    assert keys.PRUNER_MIN_RESOURCE_AUTO not in study.user_attrs
    auto.observe(1, {keys.OVERHEAD_S: 30.0, keys.STEP_S: 10.0}, completed_step=12)
    assert study.pruner._patience == 2 and study.pruner._wrapped_pruner._min_resource == 9
    record = study.user_attrs[keys.PRUNER_MIN_RESOURCE_AUTO]
    assert (record["min_resource"], record["at_trial"], record["max_step"]) == (9, 1, 12)


def _stored_study(db: Path) -> optuna.Study:
    """Two finished trials with their measured timings (30 s and 10 s a step, and 30 s and
    20 s), one completed at step 6."""
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name="hpo")
    for step_s, state in ((10.0, optuna.trial.TrialState.COMPLETE),
                          (20.0, optuna.trial.TrialState.PRUNED)):
        trial = study.ask()
        trial.set_user_attr(keys.OVERHEAD_S, 30.0)
        trial.set_user_attr(keys.STEP_S, step_s)
        for step in range(1, 7):
            trial.report(1.0 / step, step)
        study.tell(trial, 0.5 if state == optuna.trial.TrialState.COMPLETE else None, state=state)
    return study


def test_a_restart_starts_from_the_timings_the_study_holds(tmp_path: Path) -> None:
    """Medians 30 s and 15 s a step: 30 x 0.75 / (0.25 x 15) = 6, the completed trial's last
    step; the pruner is rebuilt with it before any trial of this run ends."""
    db = tmp_path / "hpo.db"
    study = _stored_study(db)
    auto = AutoPruner(study, _config())
    auto.seed(create_engine(f"sqlite:///{db}"))
    assert auto.choice.max_step == 6 and auto.choice.value == 6
    assert study.pruner._wrapped_pruner._min_resource == 6
    assert study.user_attrs[keys.PRUNER_MIN_RESOURCE_AUTO]["measured_trials"] == 2
    capped = AutoPruner(study, _config(max_resource=4))
    capped.seed(create_engine(f"sqlite:///{db}"))
    assert capped.choice.max_step == 6 and capped.choice.value == 6  # the larger last step
    empty = optuna.create_study(storage=f"sqlite:///{tmp_path / 'empty.db'}", study_name="hpo")
    nothing = AutoPruner(empty, _config())
    nothing.seed(create_engine(f"sqlite:///{tmp_path / 'empty.db'}"))
    assert nothing.choice.max_step is None and nothing.choice.value is None
    assert isinstance(empty.pruner, optuna.pruners.MedianPruner)  # untouched: Optuna's default
