"""The replay against Optuna deciding live (pruning/_replay.py), where the earlier tests did not
look, for the mutants mutmut found unguarded (docs/MUTATION.md, "mutmut"): a study that
maximizes, the study's own recorded pruner options (an option the grid does not vary is the
study's), trial numbers with a gap (deleted trials: Hyperband brackets a trial by its number),
and the JSON tune-pruner --json prints of each setting."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.pruning import PrunerSetting, ReplayResult, StudyCurves, TrialCurve, load_curves, replay
from tests.pruning.test_pruning import STEPS, _curve

HYPERBAND = PrunerSetting("hyperband", min_resource=1, reduction_factor=3)
N_TRIALS = 30


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _outcomes(study: optuna.Study) -> dict[int, str]:
    return {t.number: {"COMPLETE": "complete", "PRUNED": "pruned"}[t.state.name]
            for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")}


def test_a_maximized_study_is_replayed_as_it_maximized() -> None:
    """Median pruning from the first step: in a study that maximizes, a trial below the first
    one's values is stopped; the same curves minimized would stop the other way round."""
    steps = tuple((s, 10.0 + s) for s in range(1, 5))
    low = tuple((s, 1.0 + s) for s in range(1, 5))
    median = PrunerSetting("median", n_warmup_steps=0, n_startup_trials=1)
    curves = [TrialCurve(0, "COMPLETE", 14.0, steps, 1.0, 1.0),
              TrialCurve(1, "COMPLETE", 5.0, low, 1.0, 1.0)]
    up = replay(StudyCurves("hpo", "maximize", {}, curves), median)
    down = replay(StudyCurves("hpo", "minimize", {}, curves), median)
    assert (up.outcomes, up.prune_steps) == ({0: "complete", 1: "pruned"}, {1: 1})
    assert down.outcomes == {0: "complete", 1: "complete"}


def test_an_option_the_grid_does_not_vary_is_the_studys() -> None:
    """Curves that worsen by 0.01 a step, each trial behind the last: patience 0 with min_delta
    0 lets Hyperband stop some; the study's min_delta of 100 (a trial must worsen by more than
    that before Hyperband is asked) stops none."""
    curves = [TrialCurve(n, "COMPLETE", n + 0.01 * STEPS,
                         tuple((s, n + 0.01 * s) for s in range(1, STEPS + 1)), 1.0, 1.0)
              for n in range(N_TRIALS)]
    patient = PrunerSetting("patient_hyperband", patience=0, min_resource=1, reduction_factor=3)
    plain = replay(StudyCurves("hpo", "minimize", {}, curves), patient)
    recorded = {"pruner": {"name": "patient_hyperband", "min_delta": 100.0, "patience_mode": "veto"}}
    lenient = replay(StudyCurves("hpo", "minimize", recorded, curves), patient)
    assert plain.prune_rate > 0.0 and lenient.prune_rate == 0.0


def test_a_gap_in_the_trial_numbers_keeps_every_later_trial_in_its_bracket(tmp_path: Path) -> None:
    """Trial #5 failed before its first report and was deleted; Optuna's Hyperband, live,
    bracketed every later trial by its number: the replay of the rest decides as it did."""
    memory = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="known", storage=memory, pruner=HYPERBAND.build())
    for number in range(N_TRIALS):
        trial = study.ask()
        if number == 5:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        values = _curve(number)
        for step, value in enumerate(values, start=1):
            trial.report(value, step)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, values[-1])
    live = _outcomes(study)
    assert "pruned" in live.values()  # the case is not trivial
    db = tmp_path / "hpo.db"
    optuna.copy_study(from_study_name="known", from_storage=memory, to_storage=f"sqlite:///{db}")
    with sqlite3.connect(db) as con:  # deleted, as a cleaning script would
        (trial_id,) = con.execute("SELECT trial_id FROM trials WHERE number = 5").fetchone()
        for table in ("trial_values", "trial_intermediate_values", "trial_params",
                      "trial_user_attributes", "trial_system_attributes", "trial_heartbeats"):
            con.execute(f"DELETE FROM {table} WHERE trial_id = ?", (trial_id,))
        con.execute("DELETE FROM trials WHERE trial_id = ?", (trial_id,))
    curves = load_curves(create_engine(f"sqlite:///{db}"), "known")
    assert [c.number for c in curves.curves] == [n for n in range(N_TRIALS) if n != 5]
    full = StudyCurves(curves.study, curves.direction, {}, [
        TrialCurve(c.number, "COMPLETE", c.value if c.value is not None else c.steps[-1][1],
                   tuple((s, v) for s, v in enumerate(_curve(c.number), start=1)), 1.0, 1.0)
        for c in curves.curves])  # every trial's whole curve, as if it had never been pruned
    assert replay(full, HYPERBAND).outcomes == live


def test_a_replay_as_json_names_every_figure() -> None:
    result = ReplayResult(
        setting=HYPERBAND, current=True, outcomes={1: "complete", 2: "pruned"}, prune_steps={2: 3},
        trials=2, prune_rate=0.123456, median_prune_step=3.0, steps_run=15, gpu_s=120.456,
        gpu_s_saved=-3.456, startup_share=0.123456, top_k=[1], top_k_kept=[1], best_value=0.5,
        agreement=0.654321, unknown=1)
    assert result.to_json() == {
        "setting": "hyperband(min_resource=1, reduction_factor=3)", "kind": "hyperband",
        "overrides": "pruner=hyperband pruner.min_resource=1 pruner.reduction_factor=3",
        "current": True, "trials": 2, "prune_rate": 0.1235, "median_prune_step": 3.0,
        "steps_run": 15, "gpu_s": 120.46, "gpu_s_saved": -3.46, "startup_share": 0.1235,
        "top_k": [1], "top_k_kept": [1], "best_value": 0.5, "agreement": 0.6543, "unknown": 1,
        "prune_steps": {"2": 3}}
    unknown = ReplayResult(HYPERBAND, False, {}, {}, 0, 0.0, None, 0, 0.0, 0.0, None, [], [], None)
    assert (unknown.to_json()["startup_share"], unknown.to_json()["agreement"]) == (None, None)


def test_settings_are_equal_by_value_and_hash_alike() -> None:
    again = PrunerSetting("hyperband", min_resource=1, reduction_factor=3)
    assert again == HYPERBAND and hash(again) == hash(HYPERBAND) and len({again, HYPERBAND}) == 1
    assert hash(again) != hash(PrunerSetting("hyperband", min_resource=2, reduction_factor=3))
    assert HYPERBAND.values() == {"min_resource": 1, "reduction_factor": 3}


@pytest.mark.parametrize("patience", [1, 2])
def test_pruned_trials_stay_pruned_trials_for_the_delayed_verdict(patience: int) -> None:
    """A trial the study pruned at its second step, which a setting would let go on (its end
    unknown), is told as what it was: a pruned trial; one the setting prunes is told pruned
    too. The delayed verdict (``patience_mode=delay``) compares a trial with every trial that
    did not fail, so it decides as Optuna live, where those trials were pruned."""
    def curve(n: int, state: str, last: int) -> TrialCurve:
        steps = tuple((s, (n * 7919 % 13) / 13.0 + 0.5 / s) for s in range(1, last + 1))
        return TrialCurve(n, state, steps[-1][1] if state == "COMPLETE" else None, steps, 1.0, 1.0)

    recorded = {"pruner": {"name": "patient_hyperband", "patience": patience, "min_resource": 1,
                           "reduction_factor": 3, "patience_mode": "delay"}}
    setting = PrunerSetting("patient_hyperband", patience=patience, min_resource=1, reduction_factor=3)
    curves = [curve(n, "PRUNED", 2) if n % 3 == 1 else curve(n, "COMPLETE", 9) for n in range(30)]
    live = optuna.create_study(study_name="hpo", pruner=setting.build(recorded["pruner"]))
    expected: dict[int, str] = {}
    for c in curves:
        trial = live.ask()
        for step, value in c.steps:
            trial.report(value, step)
            if trial.should_prune():
                expected[c.number] = "pruned"
                break
        if c.state == "PRUNED" or c.number in expected:
            expected.setdefault(c.number, "unknown")
            live.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            expected[c.number] = "complete"
            live.tell(trial, c.value)
    result = replay(StudyCurves("hpo", "minimize", recorded, curves), setting)
    assert result.outcomes == expected and result.unknown > 0


def test_a_maximized_study_is_read_back_as_maximized(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = optuna.create_study(study_name="up", storage=url, direction="maximize")
    trial = study.ask()
    trial.report(1.0, 1)
    study.tell(trial, 1.0)
    assert load_curves(create_engine(url), "up").direction == "maximize"


def test_a_two_objective_study_has_no_pruner_to_tune(tmp_path: Path) -> None:
    from hpo_orchestrator.errors import ConfigError

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = optuna.create_study(study_name="two", storage=url, directions=["minimize", "maximize"])
    study.tell(study.ask(), [1.0, 2.0])
    with pytest.raises(ConfigError) as raised:
        load_curves(create_engine(url), "two")
    assert raised.value.message == (
        "study 'two' has 2 objectives (minimize, maximize): Optuna cannot prune a "
        "multi-objective study, so there is no pruner to tune")
    assert raised.value.hint == (
        "tune-pruner replays single-objective studies; this one's trials ran to their end "
        "(pruner off): 'hpo-orchestrator best' lists its Pareto front")


@pytest.mark.parametrize(("steps", "end", "startup", "timed"), [
    (4, "10.000000", None, (0.0, 2.5)),  # 10 s over four steps
    (1, "10.000000", None, (0.0, 10.0)),  # one step: the whole run
    (4, "00.500000", None, (0.0, 0.125)),  # under a second
    (4, "10.000000", 2.0, (2.0, 2.0)),  # its start-up (hpo.startup_s) first: 8 s over four
])
def test_a_trial_the_orchestrator_did_not_time_is_timed_by_its_run(
        tmp_path: Path, steps: int, end: str, startup: float | None,
        timed: tuple[float, float]) -> None:
    """Without hpo.overhead_s and hpo.step_s (a study run by plain Optuna) the trial's run time
    after its start-up is spread evenly over its steps."""
    db = tmp_path / "hpo.db"
    study = optuna.create_study(study_name="plain", storage=f"sqlite:///{db}")
    trial = study.ask()
    if startup is not None:
        trial.set_user_attr("hpo.startup_s", startup)
    for step in range(1, steps + 1):
        trial.report(1.0 / step, step)
    study.tell(trial, 0.25)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE trials SET datetime_start = '2026-11-29 10:00:00.000000', "
                    f"datetime_complete = '2026-11-29 10:00:{end}'")
    (curve,) = load_curves(create_engine(f"sqlite:///{db}"), "plain").curves
    assert (curve.overhead_s, curve.step_s) == timed


def test_a_workers_first_trial_carries_only_its_start_up_above_the_usual(tmp_path: Path) -> None:
    """load_curves: a reuse worker's first trial (hpo.worker_trial 1) carried the worker's
    start-up; what it took above the other trials' usual start-up (the median: 2 s) is
    ``worker_s``, here half a second. A trial still running, never timed, costs nothing."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = optuna.create_study(study_name="reuse", storage=url)
    for number, overhead in enumerate((2.5, 2.0, 2.0)):
        trial = study.ask()
        trial.set_user_attr("hpo.overhead_s", overhead)
        trial.set_user_attr("hpo.step_s", 1.0)
        trial.set_user_attr("hpo.worker_trial", 1 if number == 0 else 2)
        trial.report(1.0, 1)
        study.tell(trial, 1.0)
    running = study.ask()
    running.report(1.0, 1)
    first, _, _, last = load_curves(create_engine(url), "reuse").curves
    assert (first.overhead_s, first.worker_s) == (2.0, 0.5)
    assert (last.state, last.overhead_s, last.step_s) == ("RUNNING", 0.0, 0.0)
