"""Reuse mode: one long-lived, pinned process per slot runs many trials.

Checks pinning, what a trial can and cannot inherit from the previous one in the same
process, recycling after a failure or max_trials_per_worker, and equal results to fresh mode.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import optuna
import pytest

from tests.conftest import run_cli, trial_rows

pytestmark = pytest.mark.slow

TARGET = "objective.target=tests.objectives:"


def test_reuse_workers_stay_pinned_and_run_many_trials(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "objective=custom", TARGET + "reuse_probe", "scheduler.worker_mode=reuse",
                 "scheduler.parallel=2", "scheduler.trials_per_gpu=1", "study.n_trials=10",
                 "pruner=none", env={"HPO_ORCHESTRATOR_FAKE_GPUS": "2"})
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert len(rows) == 10 and all(r["state"] == "COMPLETE" for r in rows)
    by_pid: dict[int, list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    for row in sorted(rows, key=lambda r: r["number"]):
        a = row["attrs"]
        assert a["test.pid"] == a["hpo.pid"]
        assert a["test.cuda_visible_devices"] == a["hpo.gpu_uuid"]  # pinned at birth
        assert a["test.env_trial_number"] == str(row["number"])  # per-trial env is current
        assert a["test.phase_stack_empty"] is True and a["test.attempt"] == 1
        assert a["hpo.worker_mode"] == "reuse"
        by_pid[a["test.pid"]].append(a)
    assert len(by_pid) == 2  # one process per slot, no failure: never replaced
    for trials in by_pid.values():
        assert len({t["hpo.gpu_index"] for t in trials}) == 1
        assert [t["test.calls_in_process"] for t in trials] == list(range(1, len(trials) + 1))
        assert [t["hpo.worker_trial"] for t in trials] == list(range(1, len(trials) + 1))
        # imports and interpreter start are paid once per process, before its first trial is
        # asked (the first wave: tests/scheduler/test_first_wave.py), so in none of its trials
        assert max(t["hpo.startup_s"] for t in trials) < 1.0


@pytest.mark.long
def test_reuse_workers_are_replaced_after_failures_and_max_trials(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "objective=custom", TARGET + "chaos", "scheduler.worker_mode=reuse",
                 "scheduler.parallel=1", "study.n_trials=16", "scheduler.trial_timeout_s=3",
                 "scheduler.kill_grace_s=1", "scheduler.max_retries=0")
    assert result.code == 0, result.stderr
    rows = sorted(trial_rows(result.db), key=lambda r: r["number"])
    assert len(rows) == 16 and not [r for r in rows if r["state"] == "RUNNING"]
    for before, after in pairwise(rows):
        if before["state"] == "FAIL":  # a failed trial's process never runs another trial
            assert after["attrs"]["hpo.pid"] != before["attrs"]["hpo.pid"]
            assert after["attrs"]["hpo.worker_trial"] == 1

    capped = run_cli(Path(result.db).parent, "run", "objective=custom", TARGET + "reuse_probe",
                     "scheduler.worker_mode=reuse", "scheduler.max_trials_per_worker=3",
                     "scheduler.parallel=1", "study.n_trials=7", "study.name=capped", "pruner=none")
    assert capped.code == 0, capped.stderr
    pids = [r["attrs"]["hpo.pid"] for r in sorted(trial_rows(capped.db, "capped"),
                                                   key=lambda r: r["number"])]
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [3, 3, 1]


PARAMS = [
    {"num_leaves": 15, "max_depth": 4, "learning_rate": 0.1, "min_child_samples": 20,
     "feature_fraction": 0.8, "bagging_fraction": 0.9, "lambda_l1": 1e-3, "lambda_l2": 1e-2},
    {"num_leaves": 63, "max_depth": 8, "learning_rate": 0.05, "min_child_samples": 10,
     "feature_fraction": 0.6, "bagging_fraction": 0.7, "lambda_l1": 1e-6, "lambda_l2": 1.0},
    {"num_leaves": 31, "max_depth": 6, "learning_rate": 0.2, "min_child_samples": 40,
     "feature_fraction": 1.0, "bagging_fraction": 0.5, "lambda_l1": 0.1, "lambda_l2": 1e-5},
]


def test_reuse_gives_the_same_results_as_fresh(tmp_path: Path) -> None:
    values = {}
    for mode in ("fresh", "reuse"):
        db = tmp_path / f"{mode}.db"
        study = optuna.create_study(study_name="same", storage=f"sqlite:///{db}")
        for params in PARAMS:
            study.enqueue_trial(params)
        result = run_cli(tmp_path, "run", f"scheduler.worker_mode={mode}", "scheduler.parallel=1",
                         "study.name=same", f"storage.url=sqlite:///{db}", "pruner=none",
                         f"study.n_trials={len(PARAMS)}", "objective.n_rows=3000",
                         "objective.num_boost_round=30", "scheduler.threads_per_trial=1")
        assert result.code == 0, result.stderr
        rows = sorted(trial_rows(db, "same"), key=lambda r: r["number"])
        assert all(r["state"] == "COMPLETE" for r in rows)
        loaded = optuna.load_study(study_name="same", storage=f"sqlite:///{db}")
        values[mode] = [(t.params, t.value) for t in sorted(loaded.trials, key=lambda t: t.number)]
    assert values["fresh"] == values["reuse"]
    assert [p for p, _ in values["reuse"]] == PARAMS


def test_a_reused_workers_sweep_spares_what_its_setup_started(tmp_path: Path) -> None:
    """objective.setup starts a helper process (a data server, say) once per worker. After
    each trial but a worker's first (which also ran its setup) a reused worker's leftovers
    are swept, but only what that trial started: the helper runs through every trial of its
    worker. Two workers of 3 trials each: the first from the run's first wave, the second
    started for its trial, whose first trial's clock starts before its setup ran; each
    worker's third trial sees what the sweep after its second left."""
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.probes:uses_helper",
                     "objective.setup=tests.probes:helper_setup",
                     "scheduler.parallel=1", "scheduler.worker_mode=reuse",
                     "scheduler.max_trials_per_worker=3", "study.n_trials=6", "pruner=none")
    assert result.code == 0, result.stderr
    rows = sorted(trial_rows(result.db), key=lambda r: r["number"])
    workers = [r["attrs"]["hpo.pid"] for r in rows]
    assert workers[:3] == [workers[0]] * 3 and workers[3:] == [workers[3]] * 3 != workers[:3]
    helpers = [r["attrs"]["test.helper"] for r in rows]
    assert all(alive for _pid, alive in helpers), helpers
    assert len({pid for pid, _alive in helpers[:3]}) == len({pid for pid, _alive in helpers[3:]}) == 1
