"""Issue 26, deliverable 4: a built-in objective generates its data once per worker process,
and LightGBM bins it once per learner too (CPU, CUDA).

A reuse worker runs many trials in one process; each used to regenerate the same arrays and
bin them again. Evidence without timing: the generator's cache counts one miss for two
trials, and they trained on one pair of Datasets, whose models are those of new ones. Fresh
mode (a process per trial) is unchanged: a new process starts with empty caches.
"""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from hpo_orchestrator.objectives._generated import binary_classification, held_out_test


def _two_trials(objective: object) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=optuna.pruners.NopPruner())
    study.optimize(objective, n_trials=2)  # type: ignore[arg-type]
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2


def test_lightgbm_generates_and_bins_its_data_once_for_two_cpu_trials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    binary_classification.cache_clear()
    binned: list[object] = []
    original = LightGBMObjective._bin

    def spy(self: LightGBMObjective, params: dict, keep_raw: bool = False) -> object:
        datasets = original(self, params, keep_raw)
        binned.append(datasets)
        return datasets

    monkeypatch.setattr(LightGBMObjective, "_bin", spy)
    _two_trials(LightGBMObjective(LightGBMObjectiveConfig(n_rows=300, n_features=6,
                                                          num_boost_round=10, seed=11)))
    assert binary_classification.cache_info().misses == 1
    assert len(binned) == 1  # the second trial trained on the first one's Datasets


_CPU = {"device_type": "cpu", "verbosity": -1, "num_threads": 1}


def test_each_learner_bins_once_and_opencl_per_trial() -> None:
    """A Dataset built for the CPU cannot train on the CUDA learner (its copy lives on the
    GPU): the CUDA learner keeps its own pair, built with device_type=cuda; OpenCL's reuse has
    not been checked on a GPU host, so it gets new Datasets per trial."""
    from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    objective = LightGBMObjective(LightGBMObjectiveConfig(n_rows=300, n_features=6, seed=11))
    kept = objective._datasets(_CPU)
    assert objective._datasets({**_CPU, "num_threads": 2}) is kept
    cuda = {**_CPU, "device_type": "cuda", "gpu_device_id": 0}
    cuda_kept = objective._datasets(cuda)
    assert objective._datasets(cuda) is cuda_kept and cuda_kept[0] is not kept[0]
    assert cuda_kept[0].params["device_type"] == "cuda"  # built for the GPU
    assert cuda_kept[1].params["device_type"] == "cuda"
    opencl = {**_CPU, "device_type": "gpu"}
    opencl_first, opencl_again = objective._datasets(opencl), objective._datasets(opencl)
    assert opencl_first[0] is not opencl_again[0] and opencl_first[0] is not kept[0]


def _value(objective: object, params: dict) -> float:
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    study.enqueue_trial(params)
    study.optimize(objective, n_trials=1)  # type: ignore[arg-type]
    return float(study.best_value)


def test_reused_datasets_train_the_models_lightgbm_trains_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial with a smaller min_child_samples than the one the kept Datasets were binned
    for gets the value of plain LightGBM (a Dataset per training, its pre-filter on) with the
    same params, without binning again. The 208,000 training rows are more than LightGBM's
    bin sample (200,000): the trial's seed must pick that sample, as it does by default."""
    import lightgbm as lgb

    from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    config = LightGBMObjectiveConfig(n_rows=260_000, n_features=4, num_boost_round=20, seed=5)
    common = {"num_leaves": 15, "max_depth": 6, "learning_rate": 0.1, "feature_fraction": 0.7,
              "bagging_fraction": 0.8, "lambda_l1": 1e-3, "lambda_l2": 1e-3}
    big, small = {**common, "min_child_samples": 80}, {**common, "min_child_samples": 5}
    reused = LightGBMObjective(config)
    _value(reused, big)
    handle = reused._datasets(_CPU)[0]._handle  # LightGBM's binned copy
    value = _value(reused, small)
    assert reused._datasets(_CPU)[0]._handle is handle  # not binned again for the smaller one

    x_train, y_train, x_valid, y_valid = binary_classification(260_000, 4, 5)
    params = {"objective": "binary", "metric": "binary_logloss", "verbosity": -1,
              "num_threads": 1, "max_bin": config.max_bin, "seed": 5, **small,
              "bagging_freq": 1}
    train = lgb.Dataset(x_train, y_train)
    log: dict = {}
    lgb.train(params, train, num_boost_round=20, callbacks=[lgb.record_evaluation(log)],
              valid_sets=[lgb.Dataset(x_valid, y_valid, reference=train)])
    curve = log["valid_0"]["binary_logloss"]
    assert value == min(curve[9], curve[19])  # reported every 10 rounds: the best report


def test_torch_mlp_generates_its_data_once_for_two_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from hpo_orchestrator.config._schema import TorchMLPObjectiveConfig
    from hpo_orchestrator.objectives.torch_mlp import TorchMLPObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    binary_classification.cache_clear()
    _two_trials(TorchMLPObjective(TorchMLPObjectiveConfig(n_samples=64, n_features=4, epochs=1,
                                                          batch_size=32, seed=5)))
    info = binary_classification.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_held_out_test_is_the_same_task_and_leaves_the_first_rows_alone() -> None:
    x_train, y_train, x_valid, _ = binary_classification(400, 8, 3)
    binary_classification.cache_clear()
    again = binary_classification(400, 8, 3)
    assert np.array_equal(again[0], x_train) and np.array_equal(again[1], y_train)
    x_test, y_test = held_out_test(400, 8, 3, 300)
    assert x_test.shape == (300, 8) and 0.3 < float(y_test.mean()) < 0.7
    # no test row is a training or validation row
    seen = {row.tobytes() for row in np.concatenate([x_train, x_valid])}
    assert not any(row.tobytes() in seen for row in x_test)


def test_the_binning_benchmark_runs_both_ways_on_the_same_models() -> None:
    """scripts/bench_binning.py (docs/BENCHMARKS.md): a tiny run, the table's row printed, and
    the run fails where the two ways' best values differ (they did not here)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_binning.py"
    done = subprocess.run([sys.executable, str(script), "--rows", "600", "--trials", "2",
                           "--threads", "1", "--repeats", "1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "| 600 | 2 | 1 |" in done.stdout
