"""The built-in objectives and the benchmark's report, at every step, the value they will
return: the best validation loss so far (docs/OBJECTIVES.md, "What to report"). A pruner
then judges what the study would keep; on the raw loss it stopped trials that peaked and then
diverged, and a pruned trial's best is lost.

Each objective runs in this process on an Optuna study of its own, with settings that overfit
(a high learning rate, small data), so the raw validation loss rises somewhere: the reports
must not."""

from __future__ import annotations

import optuna
import pytest


def _trials(objective: object, params: list[dict[str, object]]) -> list[optuna.trial.FrozenTrial]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=optuna.pruners.NopPruner())
    for p in params:
        study.enqueue_trial(p)
    study.optimize(objective, n_trials=len(params))  # type: ignore[arg-type]
    return study.trials


def _best_so_far(values: list[float]) -> list[float]:
    return [min(values[:i + 1]) for i in range(len(values))]


def _reported(trial: optuna.trial.FrozenTrial) -> list[float]:
    return [trial.intermediate_values[s] for s in sorted(trial.intermediate_values)]


_OVERFIT = {"num_leaves": 256, "max_depth": 12, "learning_rate": 0.3, "min_child_samples": 5,
            "feature_fraction": 1.0, "bagging_fraction": 1.0, "lambda_l1": 1e-8, "lambda_l2": 1e-8}
_CONFIG = {"n_rows": 2_000, "n_features": 8, "num_boost_round": 60, "report_every": 5, "seed": 3}


def _raw_curves(monkeypatch: pytest.MonkeyPatch) -> list[list[float]]:
    """LightGBM's own record of each training's validation loss, every round."""
    import lightgbm as lgb

    curves: list[list[float]] = []
    train = lgb.train

    def recorded(*args: object, **kwargs: object) -> object:
        log: dict = {}
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), lgb.record_evaluation(log)]  # type: ignore[misc]
        booster = train(*args, **kwargs)  # type: ignore[arg-type]
        curves.extend(v["binary_logloss"] for v in log.values())  # trainings with a validation set
        return booster

    monkeypatch.setattr(lgb, "train", recorded)
    return curves


def _at_reports(curve: list[float]) -> list[float]:
    every = _CONFIG["report_every"]
    return [curve[r - 1] for r in range(every, len(curve) + 1, every)]


def test_the_builtin_lightgbm_reports_its_best_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    raw = _raw_curves(monkeypatch)
    (trial,) = _trials(LightGBMObjective(LightGBMObjectiveConfig(**_CONFIG, device="cpu")), [_OVERFIT])
    loss = _at_reports(raw[-1])
    assert loss != _best_so_far(loss)  # it overfits: the raw loss rises somewhere
    assert _reported(trial) == _best_so_far(loss)
    assert _reported(trial)[-1] == trial.value


def test_the_benchmarks_lightgbm_reports_its_best_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config import LightGBMObjectiveConfig
    from scripts.benchmarking.workloads import lightgbm_objective

    raw = _raw_curves(monkeypatch)
    (trial,) = _trials(lightgbm_objective(LightGBMObjectiveConfig(**_CONFIG), {"device_type": "cpu"}, 1),
                       [_OVERFIT])
    loss = _at_reports(raw[-1])
    assert loss != _best_so_far(loss)
    assert _reported(trial) == _best_so_far(loss)
    assert _reported(trial)[-1] == trial.value


def test_the_builtin_torch_mlp_reports_its_best_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from hpo_orchestrator.config import TorchMLPObjectiveConfig
    from hpo_orchestrator.objectives.torch_mlp import TorchMLPObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    objective = TorchMLPObjective(TorchMLPObjectiveConfig(n_samples=256, n_features=8, epochs=12,
                                                          batch_size=32, seed=5))
    trials = _trials(objective, [{"lr": 3e-2, "width": 512, "depth": 4, "weight_decay": 1e-6,
                                  "dropout": 0.0, "batch_size": 32}] * 2)
    for trial in trials:
        assert _reported(trial) == _best_so_far(_reported(trial))
        assert _reported(trial)[-1] == trial.value
    assert any(len(set(_reported(t))) < len(_reported(t)) for t in trials)  # a step with no new best


def test_the_benchmarks_cnn_reports_its_best_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from scripts.benchmarking import cnn

    monkeypatch.setenv("HPO_QUALITY_SCALE", "0.01")  # 240 training images
    monkeypatch.setattr(cnn, "_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(cnn, "EPOCHS", 6)
    cnn._data.cache_clear()
    params = {"lr": 3e-2, "channels": 16, "depth": 1, "dropout": 0.0, "weight_decay": 1e-6,
              "batch_size": 64}
    raw: list[float] = []
    cnn._fit(params, 0, lambda epoch, valid: raw.append(valid))  # trial 0's own training
    assert raw != _best_so_far(raw)  # the raw loss rises somewhere
    (trial,) = _trials(cnn.objective, [params])
    assert _reported(trial) == pytest.approx(_best_so_far(raw), rel=1e-6)
    assert _reported(trial)[-1] == trial.value
    cnn._data.cache_clear()
