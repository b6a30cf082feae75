"""Pruner tuning: the replay against Optuna's pruners run live on the same curves, the
recommendation, the min_resource=auto rule on fake timings, and both in a real run."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo_orchestrator.config import HyperbandPrunerConfig, MedianPrunerConfig, PatientHyperbandPrunerConfig
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.pruning import (
    PrunerSetting,
    ReplayResult,
    StudyCurves,
    load_curves,
    recommend,
    replay,
    tune,
)
from hpo_orchestrator.pruning._auto import AutoMinResource, StepTiming, fit_step_timing, min_resource_for
from hpo_orchestrator.pruning._factory import build_pruner
from tests.conftest import run_cli

STEPS = 12
N_TRIALS = 40


def _curve(number: int) -> list[float]:
    """A known learning curve per trial number: a level, a decay, and for some trials a
    plateau then a rise (so PatientPruner has something to wait for)."""
    rng = random.Random(number)
    level, decay, turn = rng.uniform(0.1, 1.0), rng.uniform(0.2, 1.0), rng.randint(2, 14)
    return [level + decay / step + (0.05 * (step - turn) if step > turn else 0.0)
            for step in range(1, STEPS + 1)]


def _live_study(db: Path, setting: PrunerSetting | None) -> None:
    """Optuna itself, one trial at a time, pruning with ``setting`` (None: never). It runs in
    memory and is then copied to the sqlite file the replay reads: the same trials, numbers
    and values, about 4x faster than deciding against sqlite."""
    pruner = setting.build() if setting else optuna.pruners.NopPruner()
    memory = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="known", storage=memory, pruner=pruner)
    config = {"pruner": {"name": setting.kind, "patience": setting.patience,
                         "min_resource": setting.min_resource,
                         "reduction_factor": setting.reduction_factor,
                         "n_warmup_steps": setting.n_warmup_steps,
                         "n_startup_trials": setting.n_startup_trials, "max_resource": "auto",
                         "patience_mode": "reach"}  # what build() runs: today's default
              } if setting else {"pruner": {"name": "none"}}
    study.set_user_attr("hpo.config", config)

    def objective(trial: optuna.Trial) -> float:
        values = _curve(trial.number)
        for step, value in enumerate(values, start=1):
            trial.report(value, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return values[-1]

    study.optimize(objective, n_trials=N_TRIALS)
    optuna.copy_study(from_study_name="known", from_storage=memory, to_storage=f"sqlite:///{db}")


SETTINGS = [
    PrunerSetting("patient_hyperband", patience=0, min_resource=1, reduction_factor=3),
    PrunerSetting("patient_hyperband", patience=2, min_resource=1, reduction_factor=2),
    PrunerSetting("patient_hyperband", patience=1, min_resource=3, reduction_factor=3),
    PrunerSetting("median", n_warmup_steps=2, n_startup_trials=5),
    PrunerSetting("hyperband", min_resource=1, reduction_factor=3),
]


def _live_outcomes(db: Path) -> dict[int, tuple[str, int]]:
    with sqlite3.connect(db) as con:
        return {n: (s, step) for n, s, step in con.execute(
            "SELECT t.number, t.state, MAX(iv.step) FROM trials t JOIN trial_intermediate_values iv "
            "USING (trial_id) GROUP BY t.trial_id")}


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.short())
def test_replay_of_full_curves_decides_as_optuna_live(tmp_path: Path, setting: PrunerSetting) -> None:
    """A study that ran without pruning holds the whole curves; replaying them with a setting
    must prune exactly where Optuna's pruner, run live on the same values, pruned."""
    full, live = tmp_path / "full.db", tmp_path / "live.db"
    _live_study(full, None)
    _live_study(live, setting)
    result = replay(load_curves(create_engine(f"sqlite:///{full}"), "known"), setting)
    expected = _live_outcomes(live)
    assert any(state == "PRUNED" for state, _ in expected.values())  # the case is not trivial
    for number, (state, step) in expected.items():
        if state == "PRUNED":
            assert result.outcomes[number] == "pruned" and result.prune_steps[number] == step, number
        else:
            assert result.outcomes[number] == "complete", number
    assert result.unknown == 0


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.short())
def test_replay_of_a_pruned_study_reproduces_it(tmp_path: Path, setting: PrunerSetting) -> None:
    db = tmp_path / "live.db"
    _live_study(db, setting)
    results = tune(load_curves(create_engine(f"sqlite:///{db}"), "known"), [], top_k=3)
    [current] = results  # the grid is empty: only the setting the study ran with
    assert current.current and current.setting == setting
    assert current.agreement == 1.0
    assert current.gpu_s_saved == pytest.approx(0.0, abs=1e-9)


def test_gentler_setting_on_a_pruned_study_has_unknown_ends(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    _live_study(db, SETTINGS[0])
    curves = load_curves(create_engine(f"sqlite:///{db}"), "known")
    never = replay(curves, PrunerSetting("median", n_warmup_steps=STEPS, n_startup_trials=N_TRIALS))
    pruned_for_real = [c.number for c in curves.curves if c.state == "PRUNED"]
    assert never.unknown == len(pruned_for_real) > 0
    assert never.prune_rate == 0.0
    assert never.gpu_s_saved <= 0  # letting trials run costs time, never saves it


def test_recommendation_keeps_the_best_trials(tmp_path: Path) -> None:
    db = tmp_path / "full.db"
    _live_study(db, None)
    curves = load_curves(create_engine(f"sqlite:///{db}"), "known")
    results = [replay(curves, s, top_k=3) for s in SETTINGS]
    choice, reason = recommend(results)
    assert len(choice.top_k_kept) == max(len(r.top_k_kept) for r in results)
    keeping = [r for r in results if len(r.top_k_kept) == len(choice.top_k_kept)]
    # to the millisecond, as recommend() compares: the live study's steps take about a
    # millisecond of real time, so two settings' savings can tie there (a flake under load)
    assert round(choice.gpu_s_saved, 3) == max(round(r.gpu_s_saved, 3) for r in keeping)
    top = ", ".join(f"#{n}" for n in choice.top_k)
    assert reason.startswith(f"keeps {'all' if len(choice.top_k_kept) == 3 else len(choice.top_k_kept)}")
    assert f"best completed trials ({top})" in reason and f"{choice.gpu_s_saved:.0f} s" in reason


def _result(setting: PrunerSetting, kept: list[int], saved: float, current: bool = False,
            prune_rate: float = 0.5) -> ReplayResult:
    """A replay outcome for recommend(): 100 s of device time run, ``saved`` s saved."""
    return ReplayResult(setting=setting, current=current, outcomes={}, prune_steps={}, trials=10,
                        prune_rate=prune_rate, median_prune_step=None, steps_run=0,
                        gpu_s=100.0 - saved, gpu_s_saved=saved, startup_share=None,
                        top_k=[1, 2, 3], top_k_kept=kept, best_value=None)


GENTLE, HARSH, MEDIAN = SETTINGS[1], SETTINGS[0], SETTINGS[3]


@pytest.mark.parametrize(("results", "chosen", "starts", "contains"), [
    pytest.param([_result(GENTLE, [1, 2, 3], 10.0), _result(HARSH, [1, 2, 3], 30.0)], HARSH,
                 "keeps all the 3 best completed trials (#1, #2, #3) and saves the most",
                 ["30 s against the study as run"], id="no-current-most-saved"),
    pytest.param([_result(GENTLE, [1, 2, 3], 5.0), _result(HARSH, [1, 2], 60.0)], GENTLE,
                 "keeps all the 3 best", ["5 s against"], id="keeping-beats-saving"),
    pytest.param([_result(GENTLE, [1, 2], 5.0), _result(HARSH, [1], 60.0)], GENTLE,
                 "keeps 2 of the 3 best", [], id="none-keeps-all"),
    pytest.param([_result(MEDIAN, [1, 2, 3], 20.0, current=True), _result(HARSH, [1, 2, 3], 23.0)],
                 MEDIAN, "the setting the study ran with keeps all the 3 best",
                 [f"the most: {HARSH.label()}, 3 s more): keep it"], id="current-within-5pc"),
    pytest.param([_result(MEDIAN, [1, 2], 20.0, current=True), _result(HARSH, [1, 2, 3], 10.0)],
                 HARSH, "keeps all the 3 best",
                 [f"the setting the study ran with ({MEDIAN.label()}) keeps 2 of 3, losing #3, "
                  "and saves 20 s"], id="current-loses-a-best-trial"),
])
def test_recommendation_reason_names_what_decided(results: list[ReplayResult], chosen: PrunerSetting,
                                                  starts: str, contains: list[str]) -> None:
    choice, reason = recommend(results)
    assert choice.setting == chosen
    assert reason.startswith(starts), reason
    for part in contains:
        assert part in reason, reason


# --- min_resource=auto ---------------------------------------------------------------------


def test_factory_passes_every_setting_to_optuna() -> None:
    """Every configured value reaches Optuna's pruner (read back from its attributes: Optuna
    has no public getter, and a dropped keyword argument falls back to a silent default)."""
    patient = build_pruner(PatientHyperbandPrunerConfig(patience=2, min_delta=0.5, min_resource=2,
                                                        max_resource=9, reduction_factor=4,
                                                        patience_mode="veto"))
    assert isinstance(patient, optuna.pruners.PatientPruner)
    assert (patient._patience, patient._min_delta) == (2, 0.5)
    hyperband = patient._wrapped_pruner
    assert (hyperband._min_resource, hyperband._max_resource, hyperband._reduction_factor) == (2, 9, 4)
    auto = PatientHyperbandPrunerConfig(min_resource="auto", patience_mode="veto")
    assert isinstance(build_pruner(auto), optuna.pruners.NopPruner)  # nothing chosen yet
    assert build_pruner(auto, min_resource=5)._wrapped_pruner._min_resource == 5
    median = build_pruner(MedianPrunerConfig(n_startup_trials=4, n_warmup_steps=2, interval_steps=3))
    assert (median._n_startup_trials, median._n_warmup_steps, median._interval_steps) == (4, 2, 3)


def test_plain_hyperband_prunes_what_patience_zero_keeps() -> None:
    """pruner=hyperband is not pruner.patience=0: Optuna's PatientPruner with patience 0 still
    waits for a step without improvement, so trials that improve at every step but stay
    behind are never pruned; Hyperband alone stops them at its rungs (what the benchmark's
    optuna-hyperband baseline does)."""
    plain = build_pruner(HyperbandPrunerConfig(min_resource=2, max_resource=9, reduction_factor=4))
    assert isinstance(plain, optuna.pruners.HyperbandPruner)
    assert (plain._min_resource, plain._max_resource, plain._reduction_factor) == (2, 9, 4)

    def pruned(pruner: optuna.pruners.BasePruner) -> int:
        study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
        for number in range(30):
            trial = study.ask()
            for step in range(1, STEPS + 1):  # better every step; later trials stay worse
                trial.report(number + 1.0 / step, step)
                if trial.should_prune():
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    break
            else:
                study.tell(trial, number + 1.0 / STEPS)
        return sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)

    patient = PatientHyperbandPrunerConfig(patience=0, min_resource=1, reduction_factor=3,
                                           patience_mode="veto")
    assert pruned(build_pruner(patient)) == 0
    assert pruned(build_pruner(HyperbandPrunerConfig())) >= 10


def test_fit_step_timing_finds_overhead_and_step_time() -> None:
    reports = [(step, 3.0 + 0.5 * step) for step in range(1, 11)]  # 3 s start, 0.5 s a step
    timing = fit_step_timing(reports, startup_s=2.0)
    assert timing == StepTiming(pytest.approx(3.0), pytest.approx(0.5))
    single = fit_step_timing([(1, 4.0)], startup_s=3.0)
    assert single == StepTiming(3.0, 1.0)
    assert fit_step_timing([], startup_s=1.0) is None


@pytest.mark.parametrize(("overhead", "step", "share", "max_step", "expected"), [
    (30.0, 10.0, 0.25, None, 9),  # 30 / (30 + 10 m) <= 0.25  <=>  m >= 9
    (30.0, 10.0, 0.5, None, 3),
    (1.0, 10.0, 0.25, None, 1),  # cheap start: prune as early as Hyperband likes
    (60.0, 1.0, 0.25, 20, 20),  # capped at the last step a completed trial reached
    (5.0, 0.0, 0.25, 12, 12),  # steps cost nothing measurable: as late as possible
])
def test_min_resource_rule(overhead: float, step: float, share: float, max_step: int | None,
                           expected: int) -> None:
    chosen = min_resource_for(overhead, step, share, max_step)
    assert chosen == expected
    if step > 0 and chosen < (max_step or math.inf):
        assert overhead / (overhead + step * chosen) <= share + 1e-9


def test_auto_min_resource_follows_the_medians() -> None:
    auto = AutoMinResource(share=0.25)
    assert auto.add(None) is False and auto.value is None  # nothing measured: nothing pruned
    assert auto.add(StepTiming(30.0, 10.0), completed_step=20) is True
    assert auto.value == 9
    assert auto.add(StepTiming(30.0, 10.0)) is False  # same medians, same value
    auto.add(StepTiming(3.0, 10.0))
    auto.add(StepTiming(3.0, 10.0))
    assert auto.value == 5  # medians of 30, 30, 3, 3: 16.5 s overhead
    auto.add(StepTiming(3.0, 10.0))  # most starts became cheap (reuse mode): prune earlier
    assert auto.value == 1
    record = auto.record()
    assert record["min_resource"] == 1 and record["measured_trials"] == 5
    assert [value for _, value in record["history"]] == [9, 5, 1]
    assert "min_resource=1" in record["reason"] and "0.25" in record["reason"]


def _run_auto(tmp_path: Path, n_trials: int) -> Path:
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.objectives:curves",
                     "scheduler.parallel=2", f"study.n_trials={n_trials}",
                     "pruner.min_resource=auto", "scheduler.gpus=none")
    assert result.code == 0, result.stderr
    return result.db


def _auto_record(db: Path) -> dict[str, Any]:
    with sqlite3.connect(db) as con:
        return json.loads(con.execute(
            "SELECT value_json FROM study_user_attributes WHERE key = 'hpo.pruner.min_resource_auto'"
        ).fetchone()[0])


@pytest.mark.long
@pytest.mark.slow
def test_run_with_auto_min_resource_records_choice_and_tune_pruner_reads_it(tmp_path: Path) -> None:
    db = _run_auto(tmp_path, 10)
    record = _auto_record(db)
    with sqlite3.connect(db) as con:
        measured = con.execute("SELECT COUNT(*) FROM trial_user_attributes "
                               "WHERE key IN ('hpo.step_s', 'hpo.overhead_s')").fetchone()[0]
    assert 1 <= record["min_resource"] <= 10 and record["reason"] and record["history"]
    assert measured == 20  # both, for every trial
    # a restart starts from every stored trial's timing (the record is rewritten at each change)
    _run_auto(tmp_path, 12)
    assert _auto_record(db)["measured_trials"] >= 10
    tuned = run_cli(tmp_path, "tune-pruner", "--json", "--patience", "0,2", "--min-resource", "1,3")
    assert tuned.code == 0, tuned.stderr
    report = json.loads(tuned.stdout)
    assert len(report["results"]) == 2 * 2 * 3 + len({0, 1, 3, 5})  # PH grid + median warm-ups
    assert report["recommendation"]["reason"] and "limits" in report


def test_replay_of_the_newest_trials_reads_and_replays_only_them(tmp_path: Path) -> None:
    """--last N on a big study: the newest N trials are read and replayed, and the ones before
    them are not padded in (padding 100k numbers was most of the time)."""
    db = tmp_path / "full.db"
    _live_study(db, None)
    engine = create_engine(f"sqlite:///{db}")
    window = load_curves(engine, "known", last=10)
    assert [c.number for c in window.curves] == list(range(N_TRIALS - 10, N_TRIALS))
    assert window.first_number == N_TRIALS - 10
    everything = load_curves(engine, "known")
    assert window.curves == everything.curves[-10:] and everything.first_number == 0
    assert load_curves(engine, "known", last=10 * N_TRIALS).curves == everything.curves
    setting = PrunerSetting("median", n_warmup_steps=2, n_startup_trials=2)
    result = replay(window, setting)
    assert sorted(result.outcomes) == list(range(N_TRIALS - 10, N_TRIALS)) and result.trials == 10
    # the newest 10, replayed alone, decide as a study made of those 10 curves only would
    alone = replay(StudyCurves(window.study, window.direction, window.config, [
        replace(c, number=c.number - window.first_number) for c in window.curves]), setting)
    assert [alone.outcomes[n - window.first_number] for n in sorted(result.outcomes)] == [
        result.outcomes[n] for n in sorted(result.outcomes)]


def test_tune_pruner_last_bounds_the_replay(tmp_path: Path) -> None:
    _live_study(tmp_path / "hpo.db", None)
    tuned = run_cli(tmp_path, "tune-pruner", "--json", "--last", "7", "--patience", "0",
                    "--min-resource", "1", "--reduction-factor", "2")
    assert tuned.code == 0, tuned.stderr
    assert {r["trials"] for r in json.loads(tuned.stdout)["results"]} == {7}
    everything = run_cli(tmp_path, "tune-pruner", "--json", "--last", "0", "--patience", "0",
                         "--min-resource", "1", "--reduction-factor", "2")
    assert {r["trials"] for r in json.loads(everything.stdout)["results"]} == {N_TRIALS}


@pytest.mark.parametrize(("args", "message"), [
    (["--top-k", "0"], "--top-k"),
    (["--patience", "a,b"], "integers"),
    (["--reduction-factor", "1"], "--reduction-factor"),
    (["--last", "-1"], "--last"),
])
def test_tune_pruner_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    db = tmp_path / "hpo.db"
    _live_study(db, None)
    result = run_cli(tmp_path, "tune-pruner", *args)
    assert result.code == 2 and result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_setting_keeps_the_recorded_options_the_grid_does_not_vary() -> None:
    """tune-pruner replays (and recommends) a grid point applied to the study's recorded pruner
    config: an option outside the grid, such as one added later, is the study's, not
    silently dropped (issue 29)."""
    from hpo_orchestrator.pruning._replay import PrunerSetting

    median = PrunerSetting("median", n_warmup_steps=2, n_startup_trials=1)
    assert median.config({"name": "median", "interval_steps": 4, "n_warmup_steps": 9}) \
        == MedianPrunerConfig(n_startup_trials=1, n_warmup_steps=2, interval_steps=4)
    patient = PrunerSetting("patient_hyperband", patience=2, min_resource=1, reduction_factor=3)
    ran = {"name": "patient_hyperband", "patience": 5, "min_delta": 0.1, "max_resource": 30,
           "min_resource": "auto"}
    # recorded before patience_mode existed: it ran Optuna's PatientPruner (veto), not the
    # default of today (reach)
    assert patient.config(ran) == PatientHyperbandPrunerConfig(
        patience=2, min_delta=0.1, min_resource=1, max_resource=30, reduction_factor=3,
        patience_mode="veto")
    assert patient.config({**ran, "patience_mode": "reach"}).patience_mode == "reach"
    assert patient.config({**ran, "max_resource": "auto"}).max_resource == "auto"
    plain = PrunerSetting("hyperband", min_resource=2, reduction_factor=4)
    assert plain.config({"name": "hyperband", "min_resource": 1, "max_resource": 30}) \
        == HyperbandPrunerConfig(min_resource=2, max_resource=30, reduction_factor=4)
    assert plain.overrides() == "pruner=hyperband pruner.min_resource=2 pruner.reduction_factor=4"
    assert plain.config(ran) == HyperbandPrunerConfig(min_resource=2, reduction_factor=4)
    # another kind's options are not this pruner's
    assert median.config(ran) == MedianPrunerConfig(n_startup_trials=1, n_warmup_steps=2)


def _timed_study(db: Path, firsts: set[int], overheads: list[float]) -> None:
    """Trials with the timing attrs the orchestrator records; ``firsts``: those that were their
    worker's first (hpo.worker_trial 1)."""
    study = optuna.create_study(study_name="timed", storage=f"sqlite:///{db}")
    for number, overhead in enumerate(overheads):
        trial = study.ask()
        for step in (1, 2, 3):
            trial.report(1.0 / step, step)
        for key, value in (("hpo.overhead_s", overhead), ("hpo.step_s", 0.5),
                           ("hpo.worker_trial", 1 if number in firsts else 2)):
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0 / 3)


def test_a_workers_start_up_is_split_from_the_trial_that_carried_it(tmp_path: Path) -> None:
    """A reuse worker's first trial carries the worker's start-up (imports, data, CUDA): the
    replay keeps it apart (paid once per worker, whatever a pruner decides) and gives that
    trial the study's usual start-up, the median of the other trials'."""
    _timed_study(tmp_path / "reuse.db", {0, 3}, [17.0, 0.2, 0.3, 16.4, 0.4])
    curves = load_curves(create_engine(f"sqlite:///{tmp_path / 'reuse.db'}"), "timed").curves
    assert [round(c.worker_s, 6) for c in curves] == [16.7, 0.0, 0.0, 16.1, 0.0]
    assert [round(c.overhead_s, 6) for c in curves] == [0.3, 0.2, 0.3, 0.3, 0.4]
    assert curves[0].cost_s(2) == pytest.approx(17.0 + 2 * 0.5)  # all of it still costs
    # a fresh worker per trial: every trial starts its own, nothing is split out
    _timed_study(tmp_path / "fresh.db", {0, 1, 2}, [17.0, 16.0, 18.0])
    fresh = load_curves(create_engine(f"sqlite:///{tmp_path / 'fresh.db'}"), "timed").curves
    assert [(c.worker_s, c.overhead_s) for c in fresh] == [(0.0, 17.0), (0.0, 16.0), (0.0, 18.0)]
