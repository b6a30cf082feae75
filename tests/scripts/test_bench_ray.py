"""Ray Tune as a benchmark contender (scripts/benchmarking/ray_worker.py, ``ray-asha``
in scripts/bench_quality.py). Ray itself is not a dependency of the project (about 150 MB):
the parts that need no Ray are tested everywhere, a short real run only where it is installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.config import LIGHTGBM_SPACE
from scripts.benchmarking.ray_worker import TuneTrial, record_trial, space_distributions
from scripts.benchmarking.tables import Store
from scripts.benchmarking.workloads import WORKLOADS, lightgbm_objective
from tests.conftest import REPO
from tests.scripts.test_bench_quality import _script

HAS_RAY = importlib.util.find_spec("ray") is not None


def _sampled_config(seed: int) -> dict[str, object]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask(space_distributions())
    return dict(trial.params)


def test_the_recorded_distributions_are_the_search_space() -> None:
    distributions = space_distributions()
    assert set(distributions) == set(LIGHTGBM_SPACE)
    for seed in range(3):
        for name, value in _sampled_config(seed).items():
            spec = LIGHTGBM_SPACE[name]
            assert spec.low <= value <= spec.high  # type: ignore[operator]
            assert distributions[name].log == spec.log


def test_the_tune_trial_runs_the_benchmarks_own_objective() -> None:
    """Suggestions come from Tune's config, every report reaches Tune with the best so far, and
    the objective returns the same best loss it reported."""
    cfg = WORKLOADS["a"].scaled(0.05).lightgbm
    config = _sampled_config(1)
    reports: list[dict[str, float]] = []
    trial = TuneTrial(config, reports.append)
    value = lightgbm_objective(cfg, {"device_type": "cpu"}, 1)(trial)
    steps = cfg.num_boost_round // cfg.report_every
    assert [r["step"] for r in reports] == list(range(1, steps + 1))
    assert value == min(r["loss"] for r in reports) == reports[-1]["best"] == trial.best
    assert trial.suggest_float("learning_rate", 0.0, 1.0) == config["learning_rate"]
    assert trial.should_prune() is False  # ASHA, in Tune, stops trials


def test_tunes_trials_are_recorded_complete_pruned_or_failed_with_their_times() -> None:
    study = optuna.create_study()
    distributions = space_distributions()
    config = {**_sampled_config(2), "tune_internal": 1}  # a key outside the space is dropped
    started = 1_795_800_000.0
    record_trial(study, {"loss": 0.41, "best": 0.39, "step": 20, "started": started}, config, 20,
                 distributions)
    record_trial(study, {"loss": 0.5, "best": 0.5, "step": 3, "started": started}, config, 20,
                 distributions)
    record_trial(study, {}, config, 20, distributions)  # stopped before its first report
    record_trial(study, {"loss": 0.6, "best": 0.6, "step": 1}, config, 20, distributions,
                 failed=True)
    complete, pruned, failed = study.trials
    state = optuna.trial.TrialState
    assert (complete.state, complete.value) == (state.COMPLETE, 0.39)  # the best, not the last
    assert (pruned.state, pruned.value) == (state.PRUNED, None)
    assert (failed.state, failed.value) == (state.FAIL, None)
    assert complete.params.keys() == LIGHTGBM_SPACE.keys()
    assert complete.datetime_start is not None and complete.datetime_complete is not None
    assert complete.datetime_start.timestamp() == started
    assert complete.datetime_complete > complete.datetime_start


def test_the_launcher_runs_one_driver_on_the_halfs_cores_and_tables_treat_it_as_a_baseline(
        tmp_path: Path) -> None:
    bq = _script()
    half = bq.Half([2, 3], list(range(4)), "second half")
    plan = bq.launches("ray-asha", bq.WORKLOADS["a"], 1.0, 7, 60.0, half, "sqlite:///x.db", tmp_path)
    assert len(plan) == 1 and plan[0].gpus == [] and plan[0].cores == [0, 1, 2, 3]
    argv = plan[0].argv
    assert argv[argv.index("-m") + 1] == "scripts.benchmarking.ray_worker"
    assert argv[argv.index("--cpus") + 1] == "4" and argv[argv.index("--seed") + 1] == "7"
    assert bq.known("ray-asha")
    assert bq.retrain_device({"contender": "ray-asha", "commands": [" ".join(argv[1:])],
                              "gpus": []}, {}) == ({"device_type": "cpu"}, None)
    store = Store(tmp_path)
    meta = {"command": "c", "commit": "x", "machine": "m", "gpu_util_mean": 0.0, "pruned": 0,
            "test": None, "budget_s": 10.0, "workload": "a", "group": "pair:ours+ray-asha",
            "seed": 1}
    store.add({**meta, "contender": "ours", "curve": [(2.0, 0.4)], "complete": 1,
               "best_value": 0.4})
    store.add({**meta, "contender": "ray-asha", "curve": [(4.0, 0.4)], "complete": 1,
               "best_value": 0.4})
    (tmp_path / "targets.json").write_text(
        '{"a": {"contender": "optuna-x", "budget_s": 10.0, "seeds": 1, '
        '"targets": {"10%": 0.5, "50%": 0.4, "100%": 0.4}}}')
    store.write_report()
    assert "| ours | ray-asha | 1 | 2.00 [-], n=1; 0/0/0; p 1 / 1 |" in (tmp_path / "results.md").read_text()


def test_ray_is_refused_for_the_cnn_and_where_it_is_not_installed(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "scripts" / "bench_quality.py"), "--out", str(tmp_path),
               "--pair", "ours,ray-asha", "--seeds", "1", "--budget", "5"]
    for workload in ("c",) if HAS_RAY else ("a", "c"):
        done = subprocess.run([*command, "--workload", workload], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: ray-asha runs the LightGBM workloads")
        assert 'hint: pip install "ray[tune]"' in done.stderr


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(not HAS_RAY, reason="Ray Tune is not installed (not a project dependency)")
def test_a_short_ray_run_records_complete_and_pruned_trials_and_leaves_no_daemon(
        tmp_path: Path) -> None:
    import time

    import psutil

    began = time.time()
    url = f"sqlite:///{tmp_path / 'ray.db'}"
    subprocess.run([sys.executable, "-m", "scripts.benchmarking.ray_worker",
                    "--workload", "a", "--scale", "0.05", "--storage", url, "--seed", "1",
                    "--cpus", "2", "--timeout", "25", "--run-dir", str(tmp_path)],
                   cwd=REPO, check=True, capture_output=True, timeout=180)
    trials = optuna.load_study(study_name="bench", storage=url).trials
    states = {t.state for t in trials}
    assert {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED} <= states, states
    assert all(t.datetime_start < t.datetime_complete for t in trials)
    assert all(t.params.keys() == LIGHTGBM_SPACE.keys() for t in trials)
    assert all(t.value is not None for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    # this run's daemons only: another Ray on the machine is none of its business
    leftover = [p.info for p in psutil.process_iter(["name", "create_time"])
                if p.info["name"] in ("raylet", "gcs_server") and p.info["create_time"] >= began]
    assert leftover == [], "Ray's daemons outlived the driver"
