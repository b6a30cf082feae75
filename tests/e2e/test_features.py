"""What Optuna and Ray Tune users expect (issue 16): ``objective.search_space`` and
``objective.data`` for the built-in objectives, ``best``, ``enqueue`` / ``study.enqueue``,
``study.timeout_s``. Unit tests first; the ``slow`` ones run studies through the CLI."""

from __future__ import annotations

import csv
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from hpo_orchestrator.cli import main
from hpo_orchestrator.cli._params import enqueue_params, find_best, load_params
from hpo_orchestrator.config import load_config
from hpo_orchestrator.config._space import LIGHTGBM_SPACE, ParamSpec, resolve_space
from hpo_orchestrator.db import ScoredTrial, pareto_front
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.objectives._suggest import suggest_all
from hpo_orchestrator.objectives._table import infer_task, load_table
from hpo_orchestrator.scheduler._outcome import classify
from tests.conftest import REPO, cli_env, trial_rows

SPACE = "objective.search_space"
QUADRATIC_OBJECTIVE = ["objective=custom",
                       "objective.target=tests.objectives:quadratic"]


def _space(*overrides: str) -> dict[str, ParamSpec]:
    config = load_config(list(overrides))
    return resolve_space(LIGHTGBM_SPACE, config.objective.search_space, "objective", "lightgbm")


# --- objective.search_space ------------------------------------------------------------------


@pytest.mark.parametrize(("override", "name", "expected"), [
    (f"{SPACE}.learning_rate.low=0.05", "learning_rate",
     ParamSpec("learning_rate", "float", 0.05, 0.3, True)),  # log: true kept from the default
    (f"{SPACE}.max_depth.value=6", "max_depth", ParamSpec("max_depth", "int", 6, 6, False)),
    (f"{SPACE}.lambda_l1.value=0.5", "lambda_l1", ParamSpec("lambda_l1", "float", 0.5, 0.5, True)),
    (f"{SPACE}.num_leaves.choices=[31,63]", "num_leaves",
     ParamSpec("num_leaves", "categorical", choices=(31, 63))),
    (f"{SPACE}.feature_fraction.step=0.1", "feature_fraction",
     ParamSpec("feature_fraction", "float", 0.4, 1.0, False, 0.1)),
    (f"{SPACE}.bagging_fraction.low=0", "bagging_fraction",
     ParamSpec("bagging_fraction", "float", 0.0, 1.0, False)),  # a float kind: 0 is 0.0
])
def test_search_space_entries(override: str, name: str, expected: ParamSpec) -> None:
    space = _space(override)
    assert space[name] == expected
    assert space["num_leaves" if name != "num_leaves" else "max_depth"] == \
        LIGHTGBM_SPACE["num_leaves" if name != "num_leaves" else "max_depth"]


@pytest.mark.parametrize(("overrides", "message"), [
    ([f"{SPACE}.learning_rate.low=0"], "learning_rate: a log range needs low > 0"),
    ([f"{SPACE}.num_leaves.choices=[31.5]"], "num_leaves.choices: this parameter is an integer"),
    ([f"{SPACE}.num_leaves.step=2"], "cannot be combined with log"),
    ([f"{SPACE}.max_depth.low=20"], "low (20) > high (12)"),
    ([f"{SPACE}.max_depth.choices=[]"], "expected a non-empty list"),
    ([f"{SPACE}.learnin_rate.value=1"], "unknown configuration key 'objective.search_space.learnin_rate'"),
    (["objective=torch_mlp", f"{SPACE}.lr.value=abc"], "lr.value: expected a number"),
])
def test_search_space_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    assert message in caught.value.message
    assert caught.value.hint


def test_unknown_parameter_hint_lists_the_parameters() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config([f"{SPACE}.learnin_rate.value=1"])
    assert "learning_rate" in (caught.value.hint or "")


def test_fixed_value_stays_compatible_with_the_study_s_ranges() -> None:
    """A fixed param is a one-point range of the same kind and log flag: a study whose earlier
    trials searched it accepts it (Optuna refuses a changed distribution kind or log flag)."""
    study = optuna.create_study()
    suggest_all(study.ask(), _space())
    fixed = _space(f"{SPACE}.learning_rate.value=0.05", f"{SPACE}.num_leaves.value=31")
    trial = study.ask()
    params = suggest_all(trial, fixed)
    assert params["learning_rate"] == 0.05 and params["num_leaves"] == 31
    assert trial.distributions["learning_rate"] == FloatDistribution(0.05, 0.05, log=True)
    assert trial.distributions["num_leaves"] == IntDistribution(31, 31, log=True)


# --- objective.data ----------------------------------------------------------------------------


def _write_csv(path: Path, rows: int = 300, regression: bool = False) -> Path:
    rng = np.random.default_rng(0)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["a", "b", "color", "label"])
        for i in range(rows):
            a, b, color = rng.normal(), rng.normal(), str(rng.choice(["red", "blue", "green"]))
            target = 3 * a + (color == "red") + 0.1 * rng.normal() if regression \
                else ("yes" if a + (color == "red") > 0.5 else "no")
            writer.writerow([a, "" if i % 17 == 0 else b, color, target])
    return path


def test_load_table_codes_text_columns_and_keeps_missing_values(tmp_path: Path) -> None:
    table = load_table(str(_write_csv(tmp_path / "d.csv")), "label")
    assert table.features == ["a", "b", "color"]
    assert table.categorical == [2]
    assert table.target_labels == ["no", "yes"]
    assert set(np.unique(table.x[:, 2])) == {0.0, 1.0, 2.0}  # blue, green, red
    assert np.isnan(table.x[0, 1]) and not np.isnan(table.x[1, 1])
    assert infer_task(table) == "binary"
    assert infer_task(load_table(str(_write_csv(tmp_path / "r.csv", regression=True)), "label")) \
        == "regression"


@pytest.mark.parametrize(("setup", "overrides", "message"), [
    (None, ["objective.data=missing.csv", "objective.target_column=label"], "objective.data: no file"),
    ("d.txt", ["objective.data=d.txt", "objective.target_column=label"], "expected a .csv or .parquet"),
    ("d.csv", ["objective.data=d.csv", "objective.target_column=lbl"], "no column 'lbl'"),
    ("d.csv", ["objective.data=d.csv"], "objective.target_column: is required"),
    (None, ["objective.target_column=label"], "applies only with objective.data"),
    ("d.csv", ["objective.data=d.csv", "objective.target_column=label", "objective.task=poisson"],
     "expected auto, binary, multiclass or regression"),
    # issue 30: a text target was accepted for regression, and every trial then failed
    ("d.csv", ["objective.data=d.csv", "objective.target_column=label", "objective.task=regression"],
     "objective.task=regression: the target column 'label' holds text"),
])
def test_data_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str | None,
                     overrides: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    if setup:
        _write_csv(tmp_path / setup, rows=5)
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    assert message in caught.value.message
    if "lbl" in message:
        assert "a, b, color, label" in (caught.value.hint or "")


def test_parquet_without_pyarrow_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config import _datafile

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setattr(_datafile, "parquet_reader_missing", lambda: True)
    with pytest.raises(ConfigError, match="reading Parquet needs pyarrow") as caught:
        load_config(["objective.data=d.parquet", "objective.target_column=label"])
    assert "pip install pyarrow" in (caught.value.hint or "")


def test_data_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_csv(tmp_path / "d.csv", rows=5)
    config = load_config(["objective.data=d.csv", "objective.target_column=label"])
    assert config.objective.data == str(tmp_path / "d.csv")


@pytest.mark.parametrize(("regression", "task"), [(False, "binary"), (True, "regression")])
def test_lightgbm_trains_on_the_users_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            regression: bool, task: str) -> None:
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.chdir(tmp_path)
    _write_csv(tmp_path / "d.csv", regression=regression)
    config = load_config(["objective.data=d.csv", "objective.target_column=label",
                          "objective.num_boost_round=20", f"{SPACE}.max_depth.value=4",
                          f"{SPACE}.learning_rate.value=0.2", f"{SPACE}.min_child_samples.value=5",
                          f"{SPACE}.lambda_l1.high=0.01", f"{SPACE}.lambda_l2.high=0.01"])
    objective = LightGBMObjective(config.objective)
    assert objective.task == task and objective.categorical == [2]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    value = objective(trial)
    assert trial.params["max_depth"] == 4
    # learned something: guessing scores ln 2 = 0.69 (binary) or the target's variance, about 10
    assert 0 < value < (2.0 if regression else 0.6)
    assert trial.user_attrs["hpo.params_effective"]["objective"] == task


# --- best ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "directions", "front"), [
    ([(3.0,), (1.0,), (1.0,), (2.0,)], ["minimize"], [1]),  # the earliest of equals
    ([(3.0,), (1.0,), (5.0,)], ["maximize"], [2]),
    ([(1.0, 1.0), (2.0, 3.0), (0.5, 0.5), (3.0, 0.2)], ["minimize", "maximize"], [0, 1, 2]),
    ([(1.0, 1.0), (1.0, 1.0)], ["minimize", "minimize"], [0, 1]),  # equals do not dominate
    ([], ["minimize", "maximize"], []),
])
def test_pareto_front(values: list[tuple[float, ...]], directions: list[str], front: list[int]) -> None:
    trials = [ScoredTrial(100 + i, i, v) for i, v in enumerate(values)]
    assert [t.number for t in pareto_front(trials, directions)] == front


def _study(url: str, name: str = "s", directions: list[str] | None = None,
           config: dict[str, Any] | None = None) -> optuna.Study:
    study = optuna.create_study(storage=url, study_name=name, directions=directions or ["minimize"])
    if config is not None:
        study.set_user_attr("hpo.config", config)
    return study


def _add(study: optuna.Study, values: list[float], **params: float) -> None:
    distributions = {"learning_rate": FloatDistribution(0.01, 0.3, log=True),
                     "num_leaves": IntDistribution(8, 256, log=True)}
    study.add_trial(create_trial(values=values, params=params,
                                 distributions={k: distributions[k] for k in params}))


LGBM_CONFIG = {"objective": {"name": "lightgbm", "search_space": {}}, "study": {"n_trials": 3}}


def test_best_prints_params_as_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = _study(url, config=LGBM_CONFIG)
    _add(study, [0.5], learning_rate=0.1, num_leaves=40)
    _add(study, [0.25], learning_rate=0.0123456789012345, num_leaves=31)
    study.add_trial(create_trial(state=TrialState.FAIL))
    assert main(["best", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "best trial #1, value 0.25" in out
    # full precision: pasted, it is the trial's value
    assert ("overrides: objective.search_space.learning_rate.value=0.0123456789012345 "
            "objective.search_space.num_leaves.value=31") in out
    assert """enqueue:   hpo-orchestrator enqueue --study s --params '{"learning_rate": """ in out
    assert main(["best", "--storage", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["number"], data["value"], data["params"]) == \
        (1, 0.25, {"learning_rate": 0.0123456789012345, "num_leaves": 31})
    assert data["overrides"][1] == "objective.search_space.num_leaves.value=31"
    # pasted back, the overrides are a valid configuration that fixes both params
    space = _space(*data["overrides"])
    assert space["learning_rate"].fixed and space["learning_rate"].low == 0.0123456789012345


def test_best_of_a_multi_objective_study_is_its_pareto_front(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = _study(url, directions=["minimize", "maximize"])
    _add(study, [1.0, 1.0], learning_rate=0.1)
    _add(study, [2.0, 3.0], learning_rate=0.2)
    _add(study, [3.0, 2.0], learning_rate=0.3)  # dominated by #1
    best = find_best(create_engine(url), None)
    assert best.directions == ["minimize", "maximize"]
    assert [(t.number, t.values) for t in best.trials] == [(0, (1.0, 1.0)), (1, (2.0, 3.0))]
    assert "value" not in best.to_json() and len(best.to_json()["best_trials"]) == 2


def test_best_without_complete_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    _study(url).add_trial(create_trial(state=TrialState.FAIL))
    assert main(["best", "--storage", url]) == 0
    assert "no COMPLETE trial yet" in capsys.readouterr().out


# --- enqueue -------------------------------------------------------------------------------------


def test_enqueue_adds_waiting_trials_that_the_budget_does_not_count(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = _study(url, config=LGBM_CONFIG)
    _add(study, [0.5], learning_rate=0.1, num_leaves=40)
    done = enqueue_params(url, None, [{"learning_rate": 0.05}, {"learning_rate": 0.06, "num_leaves": 31}])
    assert (done.added, done.skipped, done.claimed, done.n_trials) == ([1, 2], 0, 1, 3)
    again = enqueue_params(url, "s", [{"learning_rate": 0.05}])
    assert (again.added, again.skipped) == ([], 1)
    waiting = study.get_trials(states=[TrialState.WAITING])
    assert [t.system_attrs["fixed_params"] for t in waiting] == \
        [{"learning_rate": 0.05}, {"learning_rate": 0.06, "num_leaves": 31}]


@pytest.mark.parametrize(("entries", "message"), [
    ([{"learning_rate": 5.0}], "learning_rate=5.0 is outside the range [0.01, 0.3]"),
    ([{"leaves": 3}], "'leaves' is not a parameter of the lightgbm objective"),
    ([{"num_leaves": 31.5}], "num_leaves=31.5 is not an integer"),
    ([{"num_leaves": "many"}], "is not a number"),
])
def test_enqueue_checks_a_built_in_objective_s_space(tmp_path: Path, entries: list[dict[str, Any]],
                                                     message: str) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = _study(url, config=LGBM_CONFIG)
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        enqueue_params(url, None, entries)
    assert refused.value.hint is not None and "learning_rate: float in [0.01, 0.3] (log)" \
        in refused.value.hint  # the space in the hint
    assert not study.get_trials()  # nothing written


def _custom_study(url: str) -> optuna.Study:
    """A study of a custom objective (its space in its code) whose trials suggested alpha,
    n (step 2) and kind."""
    study = _study(url, config={"objective": {"name": "custom", "target": "m:f"},
                                "study": {"n_trials": 9}})
    space = {"alpha": FloatDistribution(1e-5, 0.1, log=True), "n": IntDistribution(1, 9, step=2),
             "kind": optuna.distributions.CategoricalDistribution(["a", "b"])}
    study.add_trial(create_trial(value=0.5, params={"alpha": 0.01, "n": 3, "kind": "a"},
                                 distributions=space))
    return study


CUSTOM_SPACE = ("alpha: float in [1e-05, 0.1] (log); kind: one of ['a', 'b']; "
                "n: int in [1, 9] (step 2)")


@pytest.mark.parametrize(("entries", "message"), [
    ([{"alpah": 0.001}], "--params: 'alpah' is not a parameter of the study (did you mean 'alpha'?)"),
    ([{"alpha": 5.0}], "--params: alpha=5.0 is outside the range [1e-05, 0.1]"),
    ([{"alpha": 1e-6}], "--params: alpha=1e-06 is outside the range [1e-05, 0.1]"),
    ([{"alpha": "x"}], "--params: alpha='x' is not a number (float parameter)"),
    ([{"n": 4}], "--params: n=4 is not on the grid of step 2 from 1"),
    ([{"n": 3.5}], "--params: n=3.5 is not an integer"),
    ([{"kind": "c"}], "--params: kind='c' is not one of ['a', 'b']"),
    ([{"alpha": 0.01}, {"beta": 1}], "--params[1]: 'beta' is not a parameter of the study"),
])
def test_enqueue_checks_a_custom_study_s_space_from_its_trials(tmp_path: Path, entries: list[dict[str, Any]],
                                                               message: str) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = _custom_study(url)
    with pytest.raises(ConfigError) as refused:
        enqueue_params(url, None, entries)
    assert refused.value.message == message
    assert refused.value.hint is not None and refused.value.hint.endswith(CUSTOM_SPACE)
    assert len(study.get_trials()) == 1  # nothing written


@pytest.mark.parametrize("entry", [{"alpha": 1e-5}, {"alpha": 0.1, "n": 9, "kind": "b"},
                                   {"n": 1}, {"kind": "a"}])
def test_enqueue_takes_values_of_a_custom_study_s_space(tmp_path: Path, entry: dict[str, Any]) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    _custom_study(url)
    assert enqueue_params(url, None, [entry]).added == [1]


def test_enqueue_into_a_custom_study_without_trials_takes_any_names(tmp_path: Path) -> None:
    """No trial has suggested anything yet: the space is in the objective's code only."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    _study(url, config={"objective": {"name": "custom", "target": "m:f"}})
    assert enqueue_params(url, None, [{"anything": 1}]).added == [0]


def test_enqueue_command_refuses_a_typo_with_exit_2_and_the_space(tmp_path: Path) -> None:
    _custom_study(f"sqlite:///{tmp_path / 'hpo.db'}")
    done = subprocess.run([sys.executable, "-m", "hpo_orchestrator", "enqueue", "--params",
                           '{"alpah": 0.001}'], cwd=tmp_path, env=cli_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: --params: 'alpah' is not a parameter of the study (did you mean 'alpha'?)",
        f"hint: its search space (as its trials suggested it): {CUSTOM_SPACE}"]


def test_study_enqueue_of_a_custom_run_is_checked_against_its_trials(tmp_path: Path) -> None:
    from hpo_orchestrator.study import enqueue_configured

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = _custom_study(url)
    engine = create_engine(url)
    try:
        with pytest.raises(ConfigError, match=re.escape("study.enqueue: alpha=5 is outside")):
            enqueue_configured(study, [{"alpha": 5}], "custom", engine)
        assert len(study.get_trials()) == 1
        assert enqueue_configured(study, [{"alpha": 0.05}], "custom", engine) == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize(("params", "file_text", "message"), [
    ("x", None, "--params: not JSON"),
    ('{"x": [1]}', None, "expected a number, string or boolean"),
    ("[]", None, "expected a mapping of params or a list of them"),
    ("{}", None, "expected a mapping of param names to values"),
    (None, "- x: 1\n- 3\n", "--file params.yaml[1]: expected a mapping"),
    (None, "x: [unclosed\n", "is neither JSON nor YAML"),
])
def test_enqueue_input_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params: str | None,
                              file_text: str | None, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    file = None
    if file_text is not None:
        file = Path("params.yaml")
        file.write_text(file_text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_params(params, file)


def test_enqueue_reads_a_yaml_list(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("- {x: 1.5}\n- {x: 2, name: b}\n")
    assert load_params(None, tmp_path / "p.yaml") == [{"x": 1.5}, {"x": 2, "name": "b"}]


@pytest.mark.parametrize(("overrides", "message"), [
    (["study.enqueue=[{learning_rate: 5}]"], "study.enqueue: learning_rate=5 is outside"),
    (["study.enqueue=[{x: 1}]"], "study.enqueue: 'x' is not a parameter of the lightgbm objective"),
    ([*QUADRATIC_OBJECTIVE, "study.enqueue=[{x: 1}, {x: [2]}]"],
     "study.enqueue[1]: 'x': expected a number, string or boolean"),
    (["study.timeout_grace_s=5"], "study.timeout_grace_s: applies only with study.timeout_s"),
    (["study.timeout_s=0"], "study.timeout_s: expected seconds > 0"),
])
def test_study_config_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides)


def test_study_timeout_stop_is_a_timeout_failure_unless_the_result_came() -> None:
    def verdict(outcome: Any) -> Any:
        return classify(stop_reason="study_timeout", outcome=outcome, returncode=-15,
                        timeout_s=None, oom_killed=lambda: False, log_tail=lambda: "")

    from hpo_orchestrator.worker import TrialOutcome

    stopped = verdict(None)
    assert (stopped.state, stopped.fail_reason) == (TrialState.FAIL, "timeout")
    assert "study.timeout_grace_s" in (stopped.error or "")
    assert verdict(TrialOutcome(kind="value", value=1.0)).state == TrialState.COMPLETE


# --- whole studies -------------------------------------------------------------------------------

QUADRATIC = [*QUADRATIC_OBJECTIVE, "telemetry.enabled=false"]


@pytest.mark.slow
def test_enqueued_params_run_first_and_count_once(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = cli("run", *QUADRATIC, "study.n_trials=4", "scheduler.parallel=2",
                "study.enqueue=[{x: 0.5}, {x: -1.0}]")
    assert first.code == 0, first.stderr
    rows = sorted(trial_rows(first.db), key=lambda r: r["number"])
    assert [r["state"] for r in rows] == ["COMPLETE"] * 4
    with sqlite3.connect(first.db) as con:
        x = dict(con.execute("SELECT t.number, p.param_value FROM trials t JOIN trial_params p "
                             "ON p.trial_id = t.trial_id"))
    assert (x[0], x[1]) == (0.5, -1.0)
    # resumed with the same list: nothing enqueued twice; then one set from the command line
    again = cli("run", *QUADRATIC, "study.n_trials=4", "study.enqueue=[{x: 0.5}, {x: -1.0}]")
    assert again.code == 0 and len(trial_rows(first.db)) == 4
    queued = cli("enqueue", "--params", '{"x": 1.25}')
    assert queued.code == 0 and "enqueued 1 trial(s) (#4)" in queued.stdout
    assert "budget is spent (4 of study.n_trials=4" in queued.stdout
    more = cli("run", *QUADRATIC, "study.n_trials=5")
    assert more.code == 0, more.stderr
    with sqlite3.connect(first.db) as con:
        assert con.execute("SELECT p.param_value FROM trials t JOIN trial_params p ON "
                           "p.trial_id = t.trial_id WHERE t.number = 4").fetchone() == (1.25,)
        assert con.execute("SELECT COUNT(*) FROM trials").fetchone() == (5,)
    best = json.loads(cli("best", "--json").stdout)
    assert (best["number"], best["params"]) == (0, {"x": 0.5})


SLEEPY = ["objective=custom", "objective.target=tests.objectives:sleepy",
          "telemetry.enabled=false", "study.n_trials=50", "scheduler.parallel=2"]


@pytest.mark.slow
def test_study_timeout_lets_running_trials_finish(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", *SLEEPY, "study.timeout_s=1", env={"HPO_TEST_SLEEP_S": "3"})
    assert result.code == 0, result.stderr
    assert "time limit reached: study.timeout_s=1" in result.stdout
    rows = trial_rows(result.db)
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]  # none asked ahead and failed


@pytest.mark.slow
def test_study_timeout_grace_stops_running_trials(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", *SLEEPY, "study.timeout_s=1", "study.timeout_grace_s=1",
                 "scheduler.kill_grace_s=1", env={"HPO_TEST_SLEEP_S": "120"})
    assert result.code == 0, result.stderr
    assert "time limit reached" in result.stdout
    rows = trial_rows(result.db)
    assert len(rows) == 2
    assert all(r["state"] == "FAIL" and r["attrs"]["hpo.fail_reason"] == "timeout" for r in rows)


# --- the docs' section, verbatim ----------------------------------------------------------------


def readme_commands(heading: str) -> list[str]:
    """The ``sh`` blocks under ``heading`` in docs/OBJECTIVES.md (the README's section moved
    there), one command per (joined) line."""
    text = (REPO / "docs" / "OBJECTIVES.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        commands += [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    return commands


@pytest.mark.long
@pytest.mark.slow
def test_readme_own_data_section_runs_verbatim(tmp_path: Path) -> None:
    commands = readme_commands("Your own data, search space, best params, time limit")
    assert len(commands) >= 4
    _write_csv(tmp_path / "train.csv", rows=400)
    env = cli_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    outputs = []
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    best = next(o for c, o in zip(commands, outputs, strict=True) if c.startswith("hpo-orchestrator best"))
    assert "objective.search_space.max_depth.value=6" in best
    rows = trial_rows(tmp_path / "hpo.db", "mine")
    assert {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}
    with sqlite3.connect(tmp_path / "hpo.db") as con:
        depths = {v for (v,) in con.execute("SELECT param_value FROM trial_params "
                                            "WHERE param_name = 'max_depth'")}
    assert depths == {6.0}
