"""The benchmark's per-trial records (scripts/benchmarking/records.py), and that a
run's results carry them (scripts/bench_quality.py ``collect``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna

from hpo_orchestrator import keys
from scripts.benchmarking.records import trial_records
from tests.scripts.test_bench_quality import _script

LAUNCH = datetime(2026, 11, 27, 12, 0, 0)
T0 = LAUNCH.timestamp()
MEASURED = {"learner": "cuda", "reason": "cuda 2.00 s per trial against CPU (11 threads) 4.00 s",
            "rounds": 200, "measured_num_leaves": 31, "measured_here": True,
            "timings": [{"learner": "cuda", "s_per_round": 0.0061234567, "overhead_s": 0.7766,
                         "error": None},
                        {"learner": "cpu", "s_per_round": 0.02, "overhead_s": 0.0, "error": None}]}


def _trial(number: int, start_s: float, end_s: float | None, state: Any, attrs: dict[str, Any],
           value: float | None = None) -> optuna.trial.FrozenTrial:
    dist = optuna.distributions.FloatDistribution(0.01, 0.3, log=True)
    return optuna.trial.FrozenTrial(
        number=number, state=state, value=value, values=None,
        datetime_start=LAUNCH + timedelta(seconds=start_s),
        datetime_complete=None if end_s is None else LAUNCH + timedelta(seconds=end_s),
        params={"learning_rate": 0.123456789, "num_leaves": 31},
        distributions={"learning_rate": dist,
                       "num_leaves": optuna.distributions.IntDistribution(2, 256)},
        user_attrs=attrs, system_attrs={}, intermediate_values={}, trial_id=number)


STATE = optuna.trial.TrialState
EFFECTIVE = {keys.PARAMS_EFFECTIVE: {"device_type": "cuda", "num_threads": 11},
             keys.GPU_INDEX: 2}


def test_records_say_when_where_and_what_each_trial_measured() -> None:
    trials = [
        _trial(1, 9.0, 12.5, STATE.COMPLETE, {**EFFECTIVE, keys.DEVICE_CHOICE: {
            **MEASURED, "measured_here": False}}, 0.3),
        _trial(0, 5.0, 9.0, STATE.COMPLETE, {**EFFECTIVE, keys.DEVICE_CHOICE: MEASURED}, 0.4),
        _trial(2, 11.0, None, STATE.RUNNING, {}),
        _trial(3, 130.0, 131.0, STATE.COMPLETE, EFFECTIVE, 0.2),  # started after the budget
    ]
    records = trial_records(trials, T0, budget=120.0)
    assert [r["n"] for r in records] == [0, 1, 2]  # by start; the late one left out
    first, reused, running = records
    assert first["start"] == 5.0 and first["end"] == 9.0 and first["state"] == "complete"
    assert first["learner"] == "cuda" and first["threads"] == 11 and first["gpu"] == 2
    assert first["params"] == {"learning_rate": 0.1235, "num_leaves": 31}
    cuda = first["choice"]["timings"][0]
    assert first["choice"]["learner"] == "cuda"
    assert cuda == {"learner": "cuda", "s_per_round": 0.006123, "overhead_s": 0.7766}
    assert "choice" not in reused  # it reused its worker's answer: nothing measured
    assert running["end"] is None and running["state"] == "running"
    assert "learner" not in running and "gpu" not in running  # Optuna's own processes too
    odd = {keys.DEVICE_CHOICE: {"measured_here": True, "timings": 3}, keys.PARAMS_EFFECTIVE: "x"}
    assert trial_records([_trial(5, 1.0, 2.0, STATE.COMPLETE, odd, 0.1)], T0, 120.0)[0][
        "choice"] == {"learner": None, "timings": []}  # odd attrs never cost a run its results


class _NoGpus:
    def mean(self, gpus: list[int], lo: float, hi: float) -> dict[str, float]:
        return {}

    def trace(self, gpus: list[int], lo: float, hi: float) -> list[list[float]]:
        return []


def test_a_runs_results_carry_its_trial_records(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    study = optuna.create_study(study_name="bench", storage=url)
    for trial in (_trial(0, 5.0, 9.0, STATE.COMPLETE, {**EFFECTIVE, keys.DEVICE_CHOICE: MEASURED},
                         0.4),
                  _trial(1, 9.0, 12.5, STATE.PRUNED, EFFECTIVE)):
        study.add_trial(trial)
    run = {"url": url, "launch": T0, "budget_s": 120.0, "gpus": [], "workload": "a",
           "contender": "ours"}
    result = _script().collect(run, _NoGpus(), with_test=False, threads=1)
    assert result["curve"] == [(9.0, 0.4)]
    assert [(r["n"], r["state"], r["end"]) for r in result["trials"]] == [
        (0, "complete", 9.0), (1, "pruned", 12.5)]
    assert result["trials"][0]["choice"]["learner"] == "cuda"


def _git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_source_trees_name_the_code_a_run_used_committed_or_not(tmp_path: Path) -> None:
    from scripts.benchmarking.tables import source_trees

    assert source_trees(tmp_path) == "unknown"  # no git
    repo = tmp_path / "repo"
    (repo / "hpo_orchestrator").mkdir(parents=True)
    (repo / "scripts").mkdir()
    (repo / "hpo_orchestrator" / "a.py").write_text("A = 1\n")
    (repo / "scripts" / "b.sh").write_text("echo b\n")
    (repo / "README").write_text("not source\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    committed = source_trees(repo)
    assert committed == (f"hpo_orchestrator@{_git(repo, 'rev-parse', 'HEAD:hpo_orchestrator')[:10]}"
                         f" scripts@{_git(repo, 'rev-parse', 'HEAD:scripts')[:10]}")
    (repo / "README").write_text("changed, but no source\n")
    assert source_trees(repo) == committed
    (repo / "hpo_orchestrator" / "new.py").write_text("B = 2\n")  # untracked code counts
    changed = source_trees(repo)
    assert changed.split()[0] != committed.split()[0] and changed.split()[1] == committed.split()[1]
    assert _git(repo, "diff", "--cached", "--name-only") == ""  # the real index untouched
    assert "?? hpo_orchestrator/new.py" in _git(repo, "status", "--porcelain")
    outer = tmp_path / "outer"  # the code in a folder below the top of its repository
    (outer / "sub").mkdir(parents=True)
    (repo / "hpo_orchestrator" / "new.py").unlink()
    import shutil

    shutil.copytree(repo / "hpo_orchestrator", outer / "sub" / "hpo_orchestrator")
    shutil.copytree(repo / "scripts", outer / "sub" / "scripts")
    _git(outer, "init", "-q")
    _git(outer, "add", "-A")
    _git(outer, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    assert source_trees(outer / "sub") == committed  # the same code, the same ids
