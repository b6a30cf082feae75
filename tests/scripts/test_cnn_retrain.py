"""The quality benchmark's CNN (workload (c)): the test-metric retraining starts as the
trial did (seeded with its number), so on the CPU it reproduces the trial's validation loss
and the test column is the searched model's, not another draw (docs/QUALITY.md)."""

from __future__ import annotations

import optuna
import pytest

pytest.importorskip("torch")


def test_retraining_with_the_trials_seed_reproduces_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from scripts.benchmarking import cnn

    monkeypatch.setenv("HPO_QUALITY_SCALE", "0.01")  # 240 training images
    monkeypatch.setattr(cnn, "_device", lambda: __import__("torch").device("cpu"))
    monkeypatch.setattr(cnn, "EPOCHS", 2)
    cnn._data.cache_clear()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3),
                                pruner=optuna.pruners.NopPruner())
    study.enqueue_trial({"lr": 3e-3, "channels": 16, "depth": 1, "dropout": 0.1,
                         "weight_decay": 1e-4, "batch_size": 64})
    study.optimize(cnn.objective, n_trials=2)
    trial = study.trials[1]  # number 1: a seed other than the default 0
    again = cnn.retrain_test_loss(trial.params, trial.number)
    assert again["valid_loss"] == pytest.approx(trial.value, rel=1e-6)
    other = cnn.retrain_test_loss(trial.params, trial.number + 1)
    assert other["valid_loss"] != pytest.approx(trial.value, rel=1e-6)
    cnn._data.cache_clear()
