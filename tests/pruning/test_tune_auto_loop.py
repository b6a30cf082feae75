"""``pruner.tune=auto`` (pruning/_tune_auto.py) from its promises, for the mutants mutmut found
unguarded (docs/MUTATION.md, "mutmut"): the decision's every branch in words and evidence, the
ranking by expected device time to the best (ties: the lower prune rate, then the gentler
patience), the grid within a fixed max_resource; the loop's side: the finished count read
every CHECK_S seconds, the first replay at MIN_CURVES finished trials and the next EVERY
later, the newest WINDOW trials, the verdicts and the switch history as recorded, the replay's
child (its answer, its failure in its own words, its end when the run ends first)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo_orchestrator import keys
from hpo_orchestrator.config import HyperbandPrunerConfig, PatientHyperbandPrunerConfig
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.pruning import (
    PrunerSetting,
    PrunerTuner,
    ReplayResult,
    StudyCurves,
    TrialCurve,
    _tune_auto,
)
from hpo_orchestrator.pruning._tune_auto import EVERY, MIN_CURVES, decide, expected_s_to_best, live_grid

LIVE = PrunerSetting("patient_hyperband", patience=3, min_resource=1, reduction_factor=3)
EAGER = PrunerSetting("patient_hyperband", patience=0, min_resource=1, reduction_factor=3)
GENTLE = PrunerSetting("patient_hyperband", patience=1, min_resource=1, reduction_factor=3)
BEST = 3


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _result(setting: PrunerSetting, gpu_s: float, keeps_best: bool = True, trials: int = 2,
            prune_rate: float = 0.5, current: bool = False, agreement: float | None = None,
            top_k: list[int] | None = None) -> ReplayResult:
    """A replay of trials #3 (the best) and #4; #4 pruned at step 2."""
    outcomes = {BEST: "complete" if keeps_best else "pruned", 4: "pruned"}
    top = [BEST] if top_k is None else top_k
    return ReplayResult(setting, current, outcomes, {4: 2}, trials, prune_rate, 2, 10, gpu_s, 0.0,
                        None, top, [n for n in top if outcomes.get(n) == "complete"], 0.1,
                        agreement, 1)


def test_expected_time_to_the_best_is_the_mean_cost_times_n_plus_one_over_two() -> None:
    assert expected_s_to_best(_result(LIVE, 100.0, trials=4)) == 62.5  # 25 s a trial x 5 / 2
    assert expected_s_to_best(_result(LIVE, 0.0, trials=0)) == float("inf")


def test_no_best_trial_no_decision() -> None:
    old = _result(LIVE, 100.0, top_k=[])
    assert decide([old], LIVE) == _tune_auto.Decision(
        False, old, None, "no completed trial among the replayed ones: no best to keep")
    assert decide([], LIVE) == _tune_auto.Decision(
        False, None, None, "no completed trial among the replayed ones: no best to keep")


def test_where_every_setting_prunes_the_best_nothing_is_switched() -> None:
    old = _result(LIVE, 100.0, keeps_best=False)
    assert decide([old, _result(EAGER, 50.0, keeps_best=False)], LIVE) == _tune_auto.Decision(
        False, old, None, f"every replayed setting prunes the best trial #{BEST}")


def test_the_live_setting_that_reaches_the_best_soonest_is_kept() -> None:
    old = _result(LIVE, 90.1234, current=True, agreement=0.123456, prune_rate=0.123456)
    other = _result(EAGER, 100.0, keeps_best=False)
    decision = decide([old, other], LIVE)
    assert decision == _tune_auto.Decision(
        False, old, old, (f"kept patience=3 min_resource=1 reduction_factor=3: of the settings "
                          f"that let the best trial #{BEST} complete in replay, it reaches it "
                          "soonest"), decision.evidence)
    assert decision.evidence == {
        "replayed_trials": 2, "from_trial": BEST, "best_trial": BEST, "settings": 2,
        "old": {"expected_s_to_best": 67.59, "device_s": 90.12, "prune_rate": 0.1235,
                "keeps_best": True, "top_kept": "1/1", "unknown": 1},
        "new": {"expected_s_to_best": 67.59, "device_s": 90.12, "prune_rate": 0.1235,
                "keeps_best": True, "top_kept": "1/1", "unknown": 1},
        "agreement": 0.1235}


def test_a_saving_of_at_most_keep_current_within_keeps_the_live_setting() -> None:
    """Expected 75 s to the best as run, 71.25 s for patience 1: 5 % exactly, not more."""
    old, near = _result(LIVE, 100.0), _result(GENTLE, 95.0)
    decision = decide([old, near], LIVE)
    assert not decision.switch and (decision.old, decision.new) == (old, near)
    assert decision.reason == (
        f"kept patience=3 min_resource=1 reduction_factor=3: it lets the best trial #{BEST} "
        "complete, and the best other setting that does (patience=1 min_resource=1 "
        "reduction_factor=3) would save 5% of the expected device time to the best (a switch "
        "needs more than 5%)")
    assert decision.evidence["old"]["device_s"] == 100.0 and decision.evidence["agreement"] is None
    free = decide([_result(LIVE, 0.0), _result(GENTLE, 0.0, prune_rate=0.25)], LIVE)
    assert not free.switch and "would save 0% of the expected" in free.reason


@pytest.mark.parametrize(("results", "why"), [
    ([_result(LIVE, 100.0, keeps_best=False), _result(EAGER, 80.0)],
     "the setting as it ran prunes it in replay (60 s instead of 75 s)"),
    ([_result(LIVE, 100.0), _result(EAGER, 80.0)],
     "20% less expected device time to the best (60 s instead of 75 s)"),
    ([_result(EAGER, 80.0)], "the setting as it ran was not replayed (60 s)"),
])
def test_a_switch_says_why(results: list[ReplayResult], why: str) -> None:
    decision = decide(results, LIVE)
    assert decision.switch and decision.new is results[-1]
    assert decision.old is (results[0] if len(results) == 2 else None)
    assert decision.reason == (f"patience=0 min_resource=1 reduction_factor=3 lets the best trial "
                               f"#{BEST} complete and reaches it soonest: {why}")
    assert decision.evidence["new"]["device_s"] == 80.0


def test_ties_go_to_the_lower_prune_rate_then_the_gentler_patience() -> None:
    """Expected times equal to the microsecond (60.00000004 and 60.0000001 s): the lower prune
    rate wins; equal in that too: the higher patience."""
    sooner = _result(EAGER, 60.00000004, trials=1, prune_rate=0.5)
    calmer = _result(GENTLE, 60.0000001, trials=1, prune_rate=0.25)
    assert decide([sooner, calmer], LIVE).new is calmer
    eager, gentle = _result(EAGER, 60.0, trials=1), _result(GENTLE, 60.0, trials=1)
    assert decide([eager, gentle], LIVE).new is gentle
    rounded = _result(EAGER, 60.4, trials=1, prune_rate=0.25)
    assert decide([rounded, _result(GENTLE, 60.2, trials=1, prune_rate=0.5)], LIVE).new is not rounded


def _curves(full_step: int = 12) -> StudyCurves:
    steps = tuple((s, 1.0 / s) for s in range(1, full_step + 1))
    return StudyCurves("hpo", "minimize", {}, [TrialCurve(0, "COMPLETE", 0.1, steps, 1.0, 1.0)])


def test_the_live_grid_holds_the_live_setting_once_and_min_resource_up_to_max_resource() -> None:
    grid = live_grid(_curves(), LIVE, max_resource=3)
    assert grid.count(LIVE) == 1 and grid[0] != LIVE  # a point of the grid: in its place
    assert {s.min_resource for s in grid} == {1, 2, 3}
    odd = PrunerSetting("patient_hyperband", patience=4, min_resource=1, reduction_factor=3)
    assert live_grid(_curves(), odd, None)[0] == odd


# --- the loop ----------------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def _study(db: Path, states: list[str], name: str = "hpo") -> optuna.Study:
    """Trials in ``states`` order, each reporting 6 falling values (the best last: #0 is the
    best complete one), recorded with patience 3 and a fixed max_resource of 6."""
    memory = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name=name, storage=memory)
    study.set_user_attr(keys.CONFIG, {"pruner": {
        "name": "patient_hyperband", "patience": 3, "min_resource": 1, "reduction_factor": 3,
        "max_resource": 6, "min_delta": 0.5, "patience_mode": "veto", "tune": "auto"}})
    for number, state in enumerate(states):
        trial = study.ask()
        for step in range(1, 7):
            trial.report(number + 1.0 / step, step)
        if state == "COMPLETE":
            study.tell(trial, number + 1.0 / 6)
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    url = f"sqlite:///{db}"
    optuna.copy_study(from_study_name=name, from_storage=memory, to_storage=url)
    return optuna.load_study(study_name=name, storage=url)


def _add(study: optuna.Study, n: int, state: str = "PRUNED") -> None:
    for _ in range(n):
        trial = study.ask()
        trial.report(9.0, 1)
        study.tell(trial, 9.0 if state == "COMPLETE" else None,
                   state=optuna.trial.TrialState.COMPLETE if state == "COMPLETE"
                   else optuna.trial.TrialState.PRUNED)


def _tuner(study: optuna.Study, db: Path, **config: Any) -> PrunerTuner:
    settings = PatientHyperbandPrunerConfig(**{"patience": 3, "min_resource": 1, "reduction_factor": 3,
                                               "tune": "auto", "patience_mode": "veto",
                                               "max_resource": 6, "min_delta": 0.5, **config})
    return PrunerTuner(study, create_engine(f"sqlite:///{db}"), settings, inline=True)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(_tune_auto, "time", fake)
    return fake


def _verdict(study: optuna.Study) -> dict[str, Any] | None:
    return optuna.load_study(study_name=study.study_name, storage=study._storage).user_attrs.get(
        keys.PRUNER_TUNING)


def test_the_finished_count_is_read_every_check_s(tmp_path: Path, clock: _Clock,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[float] = []

    def counts(connection: Any, study_id: int) -> dict[str, int]:
        read.append(clock.now)
        return {}

    monkeypatch.setattr(_tune_auto, "state_counts", counts)
    tuner = _tuner(_study(tmp_path / "hpo.db", ["COMPLETE"]), tmp_path / "hpo.db")
    for now in (100.0, 100.5, 101.0, 101.5):
        clock.now = now
        tuner.tick()
    assert read == [100.0, 101.0]


@pytest.mark.parametrize(("states", "replays"), [
    (["COMPLETE"] * (MIN_CURVES - 1), False),
    (["PRUNED"] * (MIN_CURVES - 1), False),
    (["COMPLETE"] + ["PRUNED"] * (MIN_CURVES - 1), True),
])
def test_the_first_replay_comes_at_min_curves_finished_trials(tmp_path: Path, clock: _Clock,
                                                              states: list[str], replays: bool) -> None:
    study = _study(tmp_path / "hpo.db", states)
    _tuner(study, tmp_path / "hpo.db").tick()
    assert (_verdict(study) is not None) is replays


def test_the_next_replay_comes_every_more_finished_trials(tmp_path: Path, clock: _Clock) -> None:
    """20 finished trials, one complete: too few complete, said ('waiting'); 9 more change
    nothing; the 10th brings the next try."""
    study = _study(tmp_path / "hpo.db", ["COMPLETE"] + ["PRUNED"] * (MIN_CURVES - 1))
    tuner = _tuner(study, tmp_path / "hpo.db")
    tuner.tick()
    first = _verdict(study)
    assert first is not None and first["decision"] == "waiting"
    assert first["reason"] == (f"{MIN_CURVES} of the newest {MIN_CURVES} trials finished with "
                               f"learning curves, 1 of them complete; a replay needs {MIN_CURVES}, "
                               "5 complete")
    assert first["next_at_finished"] == MIN_CURVES + EVERY
    assert set(first) == {"time", "decision", "reason", "replayed_trials", "setting",
                          "next_at_finished"}
    assert first["replayed_trials"] == MIN_CURVES
    assert first["setting"] == {"patience": 3, "min_resource": 1, "reduction_factor": 3}
    assert datetime.fromisoformat(first["time"]).utcoffset() == timedelta(0)
    _add(study, EVERY - 1)
    clock.now += 1.0
    tuner.tick()
    assert _verdict(study) == first
    _add(study, 1)
    clock.now += 1.0
    tuner.tick()
    assert _verdict(study)["next_at_finished"] == MIN_CURVES + 2 * EVERY


def test_the_replay_reads_this_studys_newest_window_trials(tmp_path: Path, clock: _Clock,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tune_auto, "WINDOW", 5)
    study = _study(tmp_path / "hpo.db", ["COMPLETE"] + ["PRUNED"] * (MIN_CURVES - 1))
    _study(tmp_path / "hpo.db", ["COMPLETE"], name="another")  # a second study in the storage
    _tuner(study, tmp_path / "hpo.db").tick()
    assert _verdict(study)["reason"].startswith("5 of the newest 5 trials finished with learning "
                                                "curves, 0 of them complete")


def _ready(db: Path) -> optuna.Study:
    """Enough curves for a replay: 10 complete, 10 pruned, #0 the best."""
    return _study(db, ["COMPLETE", "PRUNED"] * (MIN_CURVES // 2))


def test_a_switch_keeps_the_studys_other_options_and_adds_to_the_history(
        tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the replay picks, the study's pruner keeps its min_delta; the history keeps
    the switches before it; the entry names the last replayed trial."""
    study = _ready(tmp_path / "hpo.db")
    earlier = {"time": "2026-11-28T10:00:00+00:00", "at_trial": 3}
    study.set_user_attr(keys.PRUNER_HISTORY, [earlier])
    monkeypatch.setattr(_tune_auto, "decide", lambda results, live: _tune_auto.Decision(
        True, None, next(r for r in results if r.setting == EAGER), "because", {"e": 1}))
    tuner = _tuner(study, tmp_path / "hpo.db")
    tuner.tick()
    assert tuner.live == EAGER and study.pruner._min_delta == 0.5 and study.pruner._patience == 0
    history = study.user_attrs[keys.PRUNER_HISTORY]
    assert history[0] == earlier and len(history) == 2
    entry = history[1]
    assert (entry["at_trial"], entry["old"], entry["new"], entry["reason"], entry["evidence"]) == (
        MIN_CURVES - 1, {"patience": 3, "min_resource": 1, "reduction_factor": 3},
        {"patience": 0, "min_resource": 1, "reduction_factor": 3}, "because", {"e": 1})
    assert datetime.fromisoformat(entry["time"]).utcoffset() == timedelta(0)
    verdict = _verdict(study)
    assert (verdict["decision"], verdict["reason"], verdict["replayed_trials"]) == (
        "switched", "because", MIN_CURVES)


def test_a_kept_setting_is_said_and_not_switched(tmp_path: Path, clock: _Clock,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    study = _ready(tmp_path / "hpo.db")
    monkeypatch.setattr(_tune_auto, "decide", lambda results, live: _tune_auto.Decision(
        False, None, results[-1], "kept it", {}))
    tuner = _tuner(study, tmp_path / "hpo.db")
    tuner.tick()
    assert tuner.live == LIVE and keys.PRUNER_HISTORY not in study.user_attrs
    assert (_verdict(study)["decision"], _verdict(study)["reason"]) == ("kept", "kept it")


def test_the_grid_stays_within_a_fixed_max_resource(tmp_path: Path, clock: _Clock,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    monkeypatch.setattr(_tune_auto, "tune", lambda curves, grid: seen.extend(
        s.min_resource for s in grid) or [])
    study = _ready(tmp_path / "hpo.db")
    _tuner(study, tmp_path / "hpo.db", max_resource=2).tick()
    assert seen and max(seen) == 2
    seen.clear()
    _tuner(study, tmp_path / "hpo.db", max_resource="auto").tick()
    assert max(seen) > 2


def test_a_tuner_is_made_only_where_the_config_asks_and_the_study_can_prune(tmp_path: Path) -> None:
    single = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}")
    engine = create_engine(f"sqlite:///{tmp_path / 'hpo.db'}")
    auto = PatientHyperbandPrunerConfig(tune="auto")
    made = PrunerTuner.for_config(single, engine, auto)
    assert isinstance(made, PrunerTuner) and (made.study, made.engine) == (single, engine)
    assert PrunerTuner.for_config(single, engine, PatientHyperbandPrunerConfig()) is None
    assert PrunerTuner.for_config(single, engine, HyperbandPrunerConfig()) is None
    two = optuna.create_study(directions=["minimize", "maximize"])
    assert PrunerTuner.for_config(two, engine, auto) is None


# --- the child ---------------------------------------------------------------------------------

def _fail() -> None:
    raise RuntimeError("cannot load")


class _Unloadable:
    """Pickled fine; the child cannot load it back (it raises there)."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _fail, ()


def test_a_replay_runs_in_a_child_unless_inline_and_a_crash_is_told_in_its_last_words(
        tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child died on its input: the verdict is "failed", with the last line it wrote."""
    study = _ready(tmp_path / "hpo.db")
    tuner = PrunerTuner(study, create_engine(f"sqlite:///{tmp_path / 'hpo.db'}"),
                        PatientHyperbandPrunerConfig(tune="auto", min_resource=1))
    monkeypatch.setattr(_tune_auto, "live_grid", lambda *args: [_Unloadable()])
    tuner.tick()
    child = tuner._child
    assert child is not None and child.folder.name.startswith("hpo-pruner-replay-")
    assert child.process.wait(timeout=120) != 0
    tuner.tick()
    assert tuner._child is None and not child.folder.exists()
    verdict = _verdict(study)
    assert (verdict["decision"], verdict["reason"], verdict["replayed_trials"]) == (
        "failed", "the replay failed: RuntimeError: cannot load", MIN_CURVES)


def _dead_child(tmp_path: Path, stderr: bytes | None) -> Any:
    """A replay child that exited with status 3 without an answer, having written ``stderr``
    (None: its stderr file is gone too)."""
    child = object.__new__(_tune_auto._Child)
    child.folder = tmp_path / "replay"
    child.folder.mkdir()
    if stderr is not None:
        (child.folder / "stderr.txt").write_bytes(stderr)
    child.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.process.wait()
    return child


def test_a_dead_childs_answer_is_its_last_line_else_its_exit_status(tmp_path: Path) -> None:
    child = _dead_child(tmp_path, b"Traceback (most recent call last):\n  ...\nMemoryError: \xff\n")
    assert child.answer() == ("error", "MemoryError: \ufffd")
    assert not child.folder.exists()
    assert _dead_child(tmp_path, b"").answer() == ("error", "exit status 3")
    assert _dead_child(tmp_path, None).answer() == ("error", "exit status 3")
    gone = _dead_child(tmp_path, b"last words\n")
    import shutil

    shutil.rmtree(gone.folder)  # a cleaner of the temporary folder came first
    assert gone.answer() == ("error", "exit status 3")


def test_a_replay_still_running_when_the_run_ends_is_stopped_and_said(
        tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    study = _ready(tmp_path / "hpo.db")
    tuner = _tuner(study, tmp_path / "hpo.db")
    tuner.inline = False
    tuner.tick()
    child = tuner._child
    assert child is not None
    tuner.close()
    assert tuner._child is None and child.process.poll() is not None
    assert not child.folder.exists()
    verdict = _verdict(study)
    assert (verdict["decision"], verdict["reason"], verdict["replayed_trials"]) == (
        "stopped", "the run ended before the replay finished", MIN_CURVES)
    tuner.tick()  # nothing left to poll
    # a storage in trouble as the run ends: the note is left out, the run's end goes on
    again = _tuner(study, tmp_path / "hpo.db")
    again.inline = False
    clock.now += 1.0
    _add(study, EVERY)
    again.tick()
    assert again._child is not None

    def refuse(key: str, value: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(study, "set_user_attr", refuse)
    again.close()
    assert again._child is None
    json.dumps(verdict)  # the verdict is plain JSON


def test_min_complete_complete_curves_are_enough_for_a_replay(tmp_path: Path, clock: _Clock,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    replayed: list[int] = []
    monkeypatch.setattr(_tune_auto, "tune", lambda curves, grid: replayed.append(
        len(curves.curves)) or [])
    study = _study(tmp_path / "hpo.db", ["COMPLETE"] * 5 + ["PRUNED"] * (MIN_CURVES - 5))
    _tuner(study, tmp_path / "hpo.db").tick()
    assert replayed == [MIN_CURVES]


def test_the_childs_main_answers_with_the_replays_or_the_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """It lowers its own priority (10), reads (curves, grid), and writes ("ok", results), or
    ("error", the exception in a line), through a file renamed into place."""
    import pickle

    niced: list[int] = []
    monkeypatch.setattr(_tune_auto.os, "nice", lambda n: niced.append(n) or 0)
    curves = StudyCurves("hpo", "minimize", {}, [
        TrialCurve(n, state, 1.0 + n, ((1, 2.0 + n), (2, 1.0 + n)), 1.0, 1.0)
        for n, state in enumerate(["COMPLETE", "PRUNED", "COMPLETE"])])
    for given, expected in ((curves, ("ok", _tune_auto.tune(curves, [EAGER]))),
                            (StudyCurves("hpo", "minimize", {}, []),
                             ("error", "ConfigError: study 'hpo' has 0 finished trials with "
                                       "intermediate values; a replay needs at least 2"))):
        folder = tmp_path / f"replay-{len(given.curves)}"
        folder.mkdir()
        (folder / "in.pickle").write_bytes(pickle.dumps((given, [EAGER])))
        monkeypatch.setattr(sys, "argv", ["-c", str(folder)])
        _tune_auto.child_main()
        assert pickle.loads((folder / "out.pickle").read_bytes()) == expected
        assert sorted(p.name for p in folder.iterdir()) == ["in.pickle", "out.pickle"]
    assert niced == [10, 10]

    def refused(n: int) -> int:  # a priority it may not lower (a container's seccomp)
        raise PermissionError("nice")

    monkeypatch.setattr(_tune_auto.os, "nice", refused)
    folder = tmp_path / "replay-refused"
    folder.mkdir()
    (folder / "in.pickle").write_bytes(pickle.dumps((curves, [EAGER])))
    monkeypatch.setattr(sys, "argv", ["-c", str(folder)])
    _tune_auto.child_main()
    assert pickle.loads((folder / "out.pickle").read_bytes())[0] == "ok"
