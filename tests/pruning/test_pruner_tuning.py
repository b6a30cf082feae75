"""pruner.tune=auto (pruning/_tune_auto.py): the orchestrator replays the study's curves during the
run and switches its pruner's setting; never to one that prunes the best replayed trial. The
switches are recorded (hpo.pruner_history) and shown by status and report."""

from __future__ import annotations

import json
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo_orchestrator import keys
from hpo_orchestrator.config import PatientHyperbandPrunerConfig
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.pruning import PrunerSetting, PrunerTuner, load_curves, tune
from hpo_orchestrator.pruning._replay import KEEP_CURRENT_WITHIN
from hpo_orchestrator.pruning._tune_auto import MIN_CURVES, decide, expected_s_to_best, live_grid
from tests.conftest import run_cli

STEPS = 12
N_TRIALS = 30
BEST = 13  # the best trial's number
AS_RUN = PrunerSetting("patient_hyperband", patience=3, min_resource=1, reduction_factor=3)
# these studies are about PatientPruner (patience_mode=veto), whatever the default's mode
VETO = {"name": "patient_hyperband", "patience_mode": "veto"}
EAGER = PrunerSetting("patient_hyperband", patience=0, min_resource=1, reduction_factor=3)


def _curve(number: int, late_best: bool) -> list[float]:
    """Two thirds of the trials get worse from their first step on (patience only delays
    their end); the others improve at every step. The best trial (#13) is the lowest at every
    step, or, with ``late_best``, the worst of all for four steps and then far the best."""
    if number == BEST:
        if late_best:
            return [2.0 + 0.05 * s if s <= 4 else 0.05 + 0.1 / s for s in range(1, STEPS + 1)]
        return [0.1 + 0.5 / s for s in range(1, STEPS + 1)]
    if number % 3 == 0:
        return [0.3 + (number % 7) / 20 + 0.5 / s for s in range(1, STEPS + 1)]
    return [0.8 + (number % 5) / 20 + 0.05 * s for s in range(1, STEPS + 1)]


def _study(db: Path, late_best: bool, tune_mode: str = "auto") -> optuna.Study:
    """The study as run with patience 3 (Optuna itself deciding, one trial at a time, in
    memory), copied to sqlite with a cost per trial: 2 s of start-up, 1 s a step."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    memory = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="hpo", storage=memory, pruner=AS_RUN.build(VETO))
    study.set_user_attr(keys.CONFIG, {"pruner": {
        "name": "patient_hyperband", "patience": 3, "min_resource": 1, "reduction_factor": 3,
        "max_resource": "auto", "min_delta": 0.0, "patience_mode": "veto", "tune": tune_mode},
        "study": {"n_trials": N_TRIALS}})

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr(keys.OVERHEAD_S, 0.5)
        trial.set_user_attr(keys.STEP_S, 1.0)
        values = _curve(trial.number, late_best)
        for step, value in enumerate(values, start=1):
            trial.report(value, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return values[-1]

    study.optimize(objective, n_trials=N_TRIALS)
    url = f"sqlite:///{db}"
    optuna.copy_study(from_study_name="hpo", from_storage=memory, to_storage=url)
    return optuna.load_study(study_name="hpo", storage=url, pruner=AS_RUN.build(VETO))


def _tuner(study: optuna.Study, db: Path) -> PrunerTuner:
    config = PatientHyperbandPrunerConfig(patience=3, min_resource=1, reduction_factor=3, tune="auto",
                                          patience_mode="veto")
    return PrunerTuner(study, create_engine(f"sqlite:///{db}"), config, inline=True)


def _attr(db: Path, key: str) -> Any:
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT value_json FROM study_user_attributes WHERE key = ?", (key,)).fetchone()
    return None if row is None else json.loads(row[0])


def test_switches_to_patience_0_where_the_replay_shows_it_is_sooner_to_the_best(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    study = _study(db, late_best=False)
    tuner = _tuner(study, db)
    tuner.tick()
    history = _attr(db, keys.PRUNER_HISTORY)
    assert history is not None and len(history) == 1, _attr(db, keys.PRUNER_TUNING)
    entry = history[0]
    assert entry["old"] == {"patience": 3, "min_resource": 1, "reduction_factor": 3}
    assert entry["new"]["patience"] == 0
    evidence = entry["evidence"]
    assert evidence["best_trial"] == BEST and evidence["new"]["keeps_best"]
    assert evidence["new"]["expected_s_to_best"] < 0.9 * evidence["old"]["expected_s_to_best"]
    assert evidence["replayed_trials"] == N_TRIALS and entry["time"] and entry["reason"]
    # the study's pruner is the new setting: the next should_prune of any trial asks it
    assert isinstance(study.pruner, optuna.pruners.PatientPruner)
    assert study.pruner._patience == 0
    assert tuner.live == PrunerSetting("patient_hyperband", **entry["new"])
    assert _attr(db, keys.PRUNER_TUNING)["decision"] == "switched"
    # shown by status (terminal and --json) and by report
    status = run_cli(tmp_path, "status")
    assert status.code == 0, status.stderr
    assert "pruner tuning (pruner.tune=auto): 1 switch" in status.stdout
    assert "patience=3 min_resource=1 reduction_factor=3 -> patience=0" in " ".join(status.stdout.split())
    as_json = json.loads(run_cli(tmp_path, "status", "--json").stdout)
    assert as_json["pruner_history"] == history and as_json["pruner_tune"] is True
    page = tmp_path / "report.html"
    report = run_cli(tmp_path, "report", "--out", str(page))
    assert report.code == 0, report.stderr
    html = page.read_text()
    assert "<h3>Pruner tuning</h3>" in html and "-&gt; patience=0" in html


def test_does_not_switch_to_a_setting_that_prunes_the_best_trial(tmp_path: Path) -> None:
    """Patience 0 would stop the rising trials three steps sooner, and it would also stop the
    late best trial in its first steps: it is not taken, whatever it saves."""
    db = tmp_path / "hpo.db"
    study = _study(db, late_best=True)
    curves = load_curves(create_engine(f"sqlite:///{db}"), "hpo")
    results = tune(curves, [AS_RUN, EAGER])
    eager, as_run = (next(r for r in results if r.setting == s) for s in (EAGER, AS_RUN))
    assert eager.outcomes[BEST] == "pruned" and as_run.outcomes[BEST] == "complete"
    # it saves enough that, but for the best trial, it would be taken
    assert expected_s_to_best(eager) < (1 - KEEP_CURRENT_WITHIN) * expected_s_to_best(as_run)
    decision = decide(results, AS_RUN)
    assert not decision.switch and "kept" in decision.reason
    # the whole grid: whatever is chosen lets the best trial complete
    tuner = _tuner(study, db)
    tuner.tick()
    for entry in _attr(db, keys.PRUNER_HISTORY) or []:
        assert entry["evidence"]["new"]["keeps_best"]
        new = PrunerSetting("patient_hyperband", **entry["new"])
        assert tune(curves, [new])[-1].outcomes[BEST] == "complete"
    assert _attr(db, keys.PRUNER_TUNING)["decision"] in ("switched", "kept")


def test_no_replay_below_the_threshold_and_status_says_so(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    study = _study(db, late_best=False)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM trial_intermediate_values WHERE trial_id IN "
                    "(SELECT trial_id FROM trials WHERE number >= ?)", (MIN_CURVES - 1,))
        # leave MIN_CURVES - 1 finished trials
        con.execute("UPDATE trials SET state = 'FAIL' WHERE number >= ?", (MIN_CURVES - 1,))
    tuner = _tuner(study, db)
    tuner.tick()
    tuner.close()  # nothing was due: the run's end adds no verdict
    assert _attr(db, keys.PRUNER_TUNING) is None and _attr(db, keys.PRUNER_HISTORY) is None
    status = run_cli(tmp_path, "status")
    # status does not import the pruning package: its own copy of the threshold must agree
    shown = " ".join(status.stdout.split())
    assert f"no replay yet: the first comes at {MIN_CURVES} finished trials" in shown


def _finish_after_a_check_below_the_threshold(db: Path, tuner: PrunerTuner) -> None:
    """The tuner checks while MIN_CURVES - 1 trials have finished; the rest then finish before
    its next check (trials pruned at their first steps finish by the dozen a second)."""
    with sqlite3.connect(db) as con:
        late = con.execute("SELECT trial_id, state FROM trials WHERE number >= ?",
                           (MIN_CURVES - 1,)).fetchall()
        con.execute("UPDATE trials SET state = 'RUNNING' WHERE number >= ?", (MIN_CURVES - 1,))
    tuner.tick()
    assert _attr(db, keys.PRUNER_TUNING) is None
    with sqlite3.connect(db) as con:
        con.executemany("UPDATE trials SET state = ? WHERE trial_id = ?",
                        [(state, trial_id) for trial_id, state in late])


def test_a_first_replay_due_when_the_run_ends_is_recorded_as_stopped(tmp_path: Path) -> None:
    """A run that ends past the threshold without a replay says so, rather than "no replay
    yet"."""
    db = tmp_path / "hpo.db"
    tuner = _tuner(_study(db, late_best=False), db)
    _finish_after_a_check_below_the_threshold(db, tuner)
    tuner.close()
    verdict = _attr(db, keys.PRUNER_TUNING)
    assert verdict["decision"] == "stopped" and verdict["next_at_finished"] == MIN_CURVES
    assert "before its first replay could start" in verdict["reason"]
    assert f"; {N_TRIALS} finished)" in verdict["reason"]
    assert "latest check" in run_cli(tmp_path, "status").stdout


def test_the_run_end_leaves_an_earlier_verdict_and_a_failed_storage_alone(tmp_path: Path) -> None:
    """A run that never checked (it ended in its first round: a finished study run again)
    keeps the verdict of the run before; after a storage failure nothing is written."""
    db = tmp_path / "hpo.db"
    study = _study(db, late_best=False)
    earlier = {"decision": "kept", "reason": "an earlier run's replay"}
    study.set_user_attr(keys.PRUNER_TUNING, earlier)
    _tuner(study, db).close()
    assert _attr(db, keys.PRUNER_TUNING) == earlier
    study.set_user_attr(keys.PRUNER_TUNING, None)
    tuner = _tuner(study, db)
    _finish_after_a_check_below_the_threshold(db, tuner)
    tuner.close(record=False)
    assert _attr(db, keys.PRUNER_TUNING) is None


def test_finished_trials_without_curves_wait_with_a_reason(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    study = _study(db, late_best=False)
    with sqlite3.connect(db) as con:  # as if the objective had reported nothing
        con.execute("DELETE FROM trial_intermediate_values")
    _tuner(study, db).tick()
    verdict = _attr(db, keys.PRUNER_TUNING)
    assert verdict["decision"] == "waiting" and "0 of the newest 30 trials" in verdict["reason"]
    assert verdict["next_at_finished"] == N_TRIALS + 10


def test_replay_runs_in_a_child_and_the_loop_does_not_wait_for_it(tmp_path: Path) -> None:
    """tick() starts the replay in a child process and returns; a later tick() takes the
    answer once the child has exited, and switches then."""
    db = tmp_path / "hpo.db"
    study = _study(db, late_best=False)
    tuner = _tuner(study, db)
    tuner.inline = False
    try:
        tuner.tick()
        child = tuner._child
        assert child is not None and _attr(db, keys.PRUNER_TUNING) is None
        child.process.wait()
        tuner.tick()
    finally:
        tuner.close()
    assert tuner._child is None and not child.folder.exists()
    assert _attr(db, keys.PRUNER_TUNING)["decision"] == "switched"
    assert _attr(db, keys.PRUNER_HISTORY)[0]["new"]["patience"] == 0


def test_kept_setting_is_not_switched_for_a_small_saving() -> None:
    """The live setting stays unless the winner saves more than KEEP_CURRENT_WITHIN."""
    from hpo_orchestrator.pruning import ReplayResult

    def result(setting: PrunerSetting, gpu_s: float) -> ReplayResult:
        return ReplayResult(setting, False, {1: "complete", 2: "pruned"}, {2: 3}, 2, 0.5, 3, 10,
                            gpu_s, 0.0, None, [1], [1], 0.1)
    near = PrunerSetting("patient_hyperband", patience=2, min_resource=1, reduction_factor=3)
    assert not decide([result(AS_RUN, 100.0), result(near, 97.0)], AS_RUN).switch
    assert decide([result(AS_RUN, 100.0), result(near, 80.0)], AS_RUN).switch


def test_grid_keeps_min_resource_within_a_fixed_max_resource(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    _study(db, late_best=False)
    curves = load_curves(create_engine(f"sqlite:///{db}"), "hpo")
    grid = live_grid(curves, AS_RUN, max_resource=4)
    assert grid and all((s.min_resource or 1) <= 4 for s in grid) and AS_RUN in grid
    assert {s.kind for s in grid} == {"patient_hyperband"}


@pytest.mark.parametrize(("override", "message"), [
    ("pruner.tune=yes", "pruner.tune: expected auto or off"),
    ("pruner.min_resource=auto", "both choose min_resource"),
])
def test_bad_tune_settings_are_one_error_line(tmp_path: Path, override: str, message: str) -> None:
    extra = ["pruner.tune=auto"] if override != "pruner.tune=yes" else []
    result = run_cli(tmp_path, "run", override, *extra)
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.long
@pytest.mark.slow
def test_run_with_tune_auto_records_its_replay(tmp_path: Path) -> None:
    """A real run: the replay runs in a child while trials go on; the run ends with all its
    trials and a verdict (a switch in hpo.pruner_history, or why none in hpo.pruner_tuning)."""
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.objectives:rising",
                     "scheduler.parallel=2", "study.n_trials=120", "scheduler.gpus=none",
                     "pruner.tune=auto", "pruner.min_resource=1", env={"HPO_TEST_STEP_S": "0.05"})
    assert result.code == 0, result.stderr
    with sqlite3.connect(result.db) as con:
        states = dict(con.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall())
    assert states.get("COMPLETE", 0) + states.get("PRUNED", 0) == 120
    verdict = _attr(result.db, keys.PRUNER_TUNING)
    history = _attr(result.db, keys.PRUNER_HISTORY) or []
    assert verdict is not None and verdict["reason"]
    # a replay ran (120 trials take seconds more than the first check past the threshold)
    assert verdict["decision"] in ("switched", "kept", "stopped") and verdict["replayed_trials"] > 0
    assert all(e["evidence"]["new"]["keeps_best"] and e["evidence"]["old"] for e in history)
    status = run_cli(tmp_path, "status")
    assert "pruner tuning (pruner.tune=auto)" in status.stdout
