"""Issue 26, deliverable 4: a built-in objective generates its data once per worker process.

A reuse worker runs many trials in one process; each used to regenerate the same arrays.
Evidence without timing: the generator's cache counts one miss for two trials, and the arrays
two trials trained on are the same objects. Fresh mode (a process per trial) is unchanged:
a new process starts with an empty cache.
"""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from hpo_orchestrator.objectives._data import binary_classification, held_out_test


def _two_trials(objective: object) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=optuna.pruners.NopPruner())
    study.optimize(objective, n_trials=2)  # type: ignore[arg-type]
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2


def test_lightgbm_generates_its_data_once_for_two_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    binary_classification.cache_clear()
    seen: list[int] = []
    original = LightGBMObjective._datasets

    def spy(self: LightGBMObjective) -> object:
        seen.append(id(binary_classification(self.config.n_rows, self.config.n_features,
                                             self.config.seed)[0]))
        return original(self)

    monkeypatch.setattr(LightGBMObjective, "_datasets", spy)
    _two_trials(LightGBMObjective(LightGBMObjectiveConfig(n_rows=300, n_features=6,
                                                          num_boost_round=10, seed=11)))
    assert binary_classification.cache_info().misses == 1
    assert len(seen) == 2 and seen[0] == seen[1]  # the same array object in both trials


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
