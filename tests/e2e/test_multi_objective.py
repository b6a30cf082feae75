"""Several objectives (study.directions, issue 16): configuration, the child's values, the
orchestrator's verdict, progress, status, best, report, tune-pruner; whole runs (slow) for the
pruner switched off, min_resource=auto, enqueue, the failure policy and the DESIGN SQL."""

from __future__ import annotations

import io
import json
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from hpo_orchestrator.cli import main
from hpo_orchestrator.cli._progress import LiveReporter
from hpo_orchestrator.config import NoPrunerConfig, load_config
from hpo_orchestrator.db import ScoredTrial, pareto_front
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.report._data import collect_report
from hpo_orchestrator.report._html import render_html
from hpo_orchestrator.scheduler import FinishedTrial
from hpo_orchestrator.scheduler._channel import _well_formed_outcome
from hpo_orchestrator.scheduler._outcome import classify
from hpo_orchestrator.status import collect_status, render_status
from hpo_orchestrator.study import create_or_load_study, without_pruning
from hpo_orchestrator.worker import TrialOutcome
from hpo_orchestrator.worker._child import check_value
from tests.conftest import REPO, run_cli, trial_rows

TARGET = "objective.target=tests.objectives:"
CUSTOM = ["objective=custom", TARGET + "two_objectives"]
TWO = "study.directions=[minimize,maximize]"


# --- configuration -------------------------------------------------------------------------


def test_directions_override_makes_a_multi_objective_config() -> None:
    config = load_config([*CUSTOM, TWO])
    assert config.study.objectives == ["minimize", "maximize"] and config.study.multi_objective
    single = load_config(["study.direction=maximize"])
    assert single.study.objectives == ["maximize"] and not single.study.multi_objective
    assert load_config([]).study.objectives == ["minimize"]


@pytest.mark.parametrize(("overrides", "error", "hint"), [
    ([*CUSTOM, TWO, "study.direction=minimize"], "study.directions: given together with "
     "study.direction", "pass study.directions=[minimize,maximize] alone"),
    ([*CUSTOM, "study.directions=[minimize,up]"], "expected a non-empty list of minimize / maximize",
     "e.g. study.directions=[minimize,maximize]"),
    ([TWO], "objective lightgbm returns one value; study.directions asks for 2",
     "several objectives need objective=custom"),
])
def test_bad_directions_are_exit_2_with_a_hint(overrides: list[str], error: str, hint: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *overrides]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and error in err and "hint: " in err and hint in err
    assert "Traceback" not in err


def test_several_objectives_switch_the_pruner_off_with_one_line() -> None:
    config, notice = without_pruning(load_config([*CUSTOM, TWO, "pruner.min_resource=auto"]))
    assert isinstance(config.pruner, NoPrunerConfig)
    assert notice is not None and notice.startswith("pruner: off (was patient_hyperband)")
    assert "\n" not in notice and "pruner=none" in notice
    # said once by the user, or one objective: nothing changes, nothing is said
    for overrides in ([*CUSTOM, TWO, "pruner=none"], [*CUSTOM]):
        given = load_config(overrides)
        assert without_pruning(given) == (given, None)


def test_show_config_shows_the_pruner_the_run_uses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *CUSTOM, TWO, "--show-config"]) == 0
    out, err = capsys.readouterr()
    assert "pruner: off (was patient_hyperband)" in err
    assert re.search(r"^pruner:\n  name: none$", out, flags=re.M), out


def test_an_existing_study_must_agree_on_its_directions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.create_study(storage=url, study_name="hpo", directions=["minimize", "maximize"])
    with pytest.raises(ConfigError) as raised:
        create_or_load_study(load_config([*CUSTOM, f"storage.url={url}"]),
                             optuna.storages.RDBStorage(url))
    assert "already exists with direction minimize, maximize, not minimize" in raised.value.message
    assert "study.directions=[minimize,maximize]" in (raised.value.hint or "")


# --- the child's values and the verdict ------------------------------------------------------


def test_the_child_sends_several_values_as_a_tuple_of_floats() -> None:
    assert check_value((1, 2.5)) == (1.0, 2.5)
    assert check_value([np.float32(0.5), 3]) == (0.5, 3.0)
    assert check_value(np.array([1.0, 2.0])) == (1.0, 2.0)
    assert check_value(np.float64(0.25)) == 0.25  # a numpy scalar stays one value
    with pytest.raises(ValueError, match="objective returned value 1 of its 2 str"):
        check_value((1.0, "x"))
    with pytest.raises(ValueError, match="objective returned value 0 of its 2 nan"):
        check_value([float("nan"), 1.0])
    with pytest.raises(ValueError, match="empty sequence"):
        check_value(())


def test_the_orchestrator_accepts_a_tuple_of_finite_numbers_only() -> None:
    assert _well_formed_outcome(TrialOutcome(kind="value", value=(1.0, 2.0)))
    assert not _well_formed_outcome(TrialOutcome(kind="value", value=(1.0, float("inf"))))
    assert not _well_formed_outcome(TrialOutcome(kind="value", value=(True, 1.0)))
    assert not _well_formed_outcome(TrialOutcome(kind="value", value=()))


def _verdict(value: Any, directions: tuple[str, ...]) -> Any:
    return classify(stop_reason=None, outcome=TrialOutcome(kind="value", value=value),
                    returncode=0, timeout_s=None, oom_killed=lambda: False, log_tail=lambda: "",
                    directions=directions)


def test_a_wrong_count_of_values_fails_the_trial_with_a_clear_error() -> None:
    two = ("minimize", "maximize")
    assert (_verdict((1.0, 2.0), two).state, _verdict((1.0, 2.0), two).value) == \
        (TrialState.COMPLETE, (1.0, 2.0))
    wrong = _verdict(0.5, two)
    assert (wrong.state, wrong.fail_reason) == (TrialState.FAIL, "exception")
    assert wrong.error == ("ValueError: objective returned 1 value; the study has 2 objective(s) "
                           "(minimize, maximize): return one number per direction")
    assert "returned 3 values" in str(_verdict((1.0, 2.0, 3.0), two).error)
    # one objective: a one-element list is its value, two values are a mistake
    assert _verdict((0.5,), ("minimize",)).value == 0.5
    assert _verdict((0.5, 1.0), ("minimize",)).state == TrialState.FAIL


def test_progress_shows_the_pareto_front_size() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with LiveReporter(console, 4, 1, ["minimize", "minimize"], front=[(0, (1.0, 1.0))]) as reporter:
        for number, values in ((1, (0.5, 2.0)), (2, (2.0, 2.0)), (3, (0.1, 0.1))):
            reporter.finished(FinishedTrial(number=number, slot="cpu0", state=TrialState.COMPLETE,
                                            value=values, duration_s=1.0))
            if number == 2:  # #2 is dominated: the front stays #0 and #1
                assert "Pareto front 2 trial(s)" in reporter._description()
    text = out.getvalue()
    assert "values 0.5, 2" in text
    assert "Pareto front 1 trial(s)" in text.splitlines()[-1]  # #3 dominates every other


# --- reading a multi-objective study --------------------------------------------------------


@pytest.mark.parametrize("objectives", [2, 3])
def test_pareto_front_matches_the_definition(objectives: int) -> None:
    """The sweep (two objectives) and the pass against the front (more) give exactly the trials
    no other trial dominates, ties and duplicates included."""
    rng = random.Random(objectives)
    for _ in range(200):
        directions = [rng.choice(["minimize", "maximize"]) for _ in range(objectives)]
        trials = [ScoredTrial(100 + i, i, tuple(float(rng.randint(0, 3)) for _ in directions))
                  for i in range(rng.randint(0, 30))]
        signs = [1 if d == "minimize" else -1 for d in directions]

        def dominates(a: ScoredTrial, b: ScoredTrial, signs: list[int] = signs) -> bool:
            pairs = [(s * x, s * y) for s, x, y in zip(signs, a.values, b.values, strict=True)]
            return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)

        expected = [t.number for t in trials if not any(dominates(o, t) for o in trials)]
        assert [t.number for t in pareto_front(trials, directions)] == expected, (directions, trials)


def _front_study(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = optuna.create_study(storage=url, study_name="mo", directions=["minimize", "maximize"])
    study.set_user_attr("hpo.config", {"objective": {"name": "custom"}, "study": {"n_trials": 4}})
    for x, values in ((0.1, [1.0, 1.0]), (0.2, [2.0, 3.0]), (0.3, [3.0, 2.0])):
        study.add_trial(create_trial(values=values, params={"x": x},
                                     distributions={"x": FloatDistribution(0, 1)},
                                     intermediate_values={0: x, 1: x / 2}))
    study.add_trial(create_trial(state=TrialState.FAIL))
    return url


def test_status_lists_the_pareto_front(tmp_path: Path) -> None:
    report = collect_status(create_engine(_front_study(tmp_path)), None)
    assert report.best is None and report.directions == ["minimize", "maximize"]
    assert report.best_trials == [{"number": 0, "values": [1.0, 1.0], "params": {"x": 0.1}},
                                  {"number": 1, "values": [2.0, 3.0], "params": {"x": 0.2}}]
    assert json.loads(json.dumps(report.to_json(), default=str))["best_trials"][1]["number"] == 1
    out = io.StringIO()
    Console(file=out, width=200).print(render_status(report))
    text = out.getvalue()
    assert "(minimize, maximize)" in text.splitlines()[0]
    assert "Pareto front: 2 trial(s) (minimize, maximize)" in text
    assert "trial 1: 2.0, 3.0  params: x=0.2" in text and "trial 2:" not in text


def test_status_of_one_trial_shows_every_value(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url = _front_study(tmp_path)
    assert main(["status", "--storage", url, "--trial", "1"]) == 0
    assert "study 'mo' trial 1: COMPLETE, values 2.0, 3.0" in capsys.readouterr().out
    assert main(["status", "--storage", url, "--trial", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["value"], data["values"]) == (2.0, [2.0, 3.0])


def test_best_selects_one_pareto_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _front_study(tmp_path)
    assert main(["best", "--storage", url, "--index", "1"]) == 0
    out = capsys.readouterr().out
    assert "Pareto front, 2 trial(s); selected: trial #1" in out and "trial #0" not in out
    assert main(["best", "--storage", url, "--trial", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best_trials"] == [{"number": 0, "values": [1.0, 1.0], "params": {"x": 0.1},
                                    "overrides": []}]
    assert main(["best", "--storage", url, "--json"]) == 0
    assert [t["number"] for t in json.loads(capsys.readouterr().out)["best_trials"]] == [0, 1]
    assert main(["best", "--storage", url, "--trial", "2"]) == 2  # dominated: not on the front
    err = capsys.readouterr().err
    assert "error: --trial 2: study 'mo' has 2 best trial(s) (Pareto front: 0, 1)" in err
    assert "hint: --index takes 0 to 1" in err


def test_report_charts_the_first_objective_and_lists_the_front(tmp_path: Path) -> None:
    data = collect_report(create_engine(_front_study(tmp_path)), None)
    assert data.direction == "objective 0 of 2, minimize"
    assert data.history == [(0, 1.0), (1, 2.0), (2, 3.0)] and data.best_so_far == []
    page = render_html(data)
    assert "Pareto front (minimize, maximize)" in page and "trial 1: 2.0, 3.0" in page


def test_tune_pruner_refuses_a_multi_objective_study(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune-pruner", "--storage", _front_study(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: study 'mo' has 2 objectives (minimize, maximize): Optuna cannot prune" in err
    assert "hint: " in err and "Traceback" not in err


# --- whole runs -------------------------------------------------------------------------------


def _design_sql() -> str:
    """The multi-objective query of docs/DESIGN.md §2.6, as written there."""
    design = (REPO / "docs" / "DESIGN.md").read_text()
    start = design.index("-- several objectives (study.directions)")
    return design[start:design.index(";", start)]


@pytest.mark.slow
def test_a_multi_objective_run_enqueue_and_resume(tmp_path: Path) -> None:
    """The default pruner with min_resource=auto is switched off with one line; an objective
    written for pruning runs unchanged; values, curves and the front are stored; enqueued
    params run first, from configuration and from the command."""
    args = ["run", *CUSTOM, "study.directions=[minimize,minimize]", "pruner.min_resource=auto",
            "study.n_trials=6", "scheduler.parallel=2", "study.enqueue=[{x: 0.5}]"]
    first = run_cli(tmp_path, *args)
    assert first.code == 0, first.stderr
    assert first.stderr.count("pruner: off (was patient_hyperband)") == 1
    assert "pruner none" in first.stdout and "Pareto front 6 trial(s)" in first.stdout
    assert "Pareto front: 6 trial(s) (minimize, minimize)" in first.stdout  # the status after it
    rows = trial_rows(first.db)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 6
    with sqlite3.connect(first.db) as con:
        values = con.execute(_design_sql().replace("'NAME'", "'hpo'")).fetchall()
        steps = con.execute("SELECT COUNT(*) FROM trial_intermediate_values").fetchone()[0]
        auto = con.execute("SELECT COUNT(*) FROM study_user_attributes "
                           "WHERE key = 'hpo.pruner.min_resource_auto'").fetchone()[0]
        x0 = con.execute("SELECT param_value FROM trial_params p JOIN trials t ON "
                         "t.trial_id = p.trial_id WHERE t.number = 0").fetchone()[0]
    assert [(n, o) for n, o, _ in values] == [(n, o) for n in range(6) for o in (0, 1)]
    assert values[0][2] == pytest.approx(0.25) and values[1][2] == pytest.approx(2.25)  # x=0.5
    assert (steps, auto, x0) == (18, 0, 0.5)  # 3 reports per trial; nothing for auto to choose

    queued = run_cli(tmp_path, "enqueue", "--params", '{"x": 1.5}')
    assert queued.code == 0, queued.stderr
    again = run_cli(tmp_path, *args, "study.add_trials=1")
    assert again.code == 0, again.stderr
    assert "Pareto front 7 trial(s)" in again.stdout  # the study's front, earlier runs included
    last = trial_rows(again.db)[-1]
    assert last["state"] == "COMPLETE" and last["number"] == 6
    best = run_cli(tmp_path, "best", "--json")
    assert 1.5 in [t["params"]["x"] for t in json.loads(best.stdout)["best_trials"]]


@pytest.mark.long
@pytest.mark.slow
def test_one_value_for_two_objectives_stops_the_run_by_the_failure_policy(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "objective=custom", TARGET + "quadratic", TWO,
                     "pruner=none", "study.n_trials=8", "scheduler.parallel=2")
    assert result.code == 1, result.stderr
    message = ("ValueError: objective returned 1 value; the study has 2 objective(s) "
               "(minimize, maximize): return one number per direction")
    assert f"error: the first 5 trials all failed with the same error: {message}" in result.stderr
    assert "pruner: off" not in result.stderr  # pruner=none given: nothing to say
    assert "failing_trials" in result.stdout
    # trials still running when the policy stopped the run are 'interrupted', not this error
    failed = [r for r in trial_rows(result.db) if r["attrs"].get("hpo.fail_reason") == "exception"]
    assert len(failed) >= 5 and all(r["attrs"]["hpo.error"] == message for r in failed)
