"""The benchmark's workloads, one definition for every contender.

Ours runs a workload through ``hpo-orchestrator run`` with :attr:`Workload.overrides`; Optuna's
own processes (optuna_worker.py) build the same model from the same pieces the product uses:
the data generator (objectives/_generated.py), the search space (config/_space.py, suggested by
objectives/_suggest.py) and the config defaults (max_bin, seed, rounds, report interval) of
LightGBMObjectiveConfig. The objective below is what a careful Optuna user writes: train,
report the best validation loss so far every ``report_every`` rounds (the value it will
return, as the product's objectives report: docs/OBJECTIVES.md), prune, return it.

:func:`test_metric` judges a run's best params where no trial looked: retrained once on the
training rows, the iteration chosen by the validation loss (as the trial's value was), the
log loss read on :func:`held_out_test` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hpo_orchestrator.config import (
    LIGHTGBM_SPACE,
    TORCH_MLP_SPACE,
    LightGBMObjectiveConfig,
    TorchMLPObjectiveConfig,
)
from hpo_orchestrator.objectives import binary_classification, held_out_test, suggest_all

__all__ = ["WORKLOADS", "Workload", "lightgbm_objective", "start_points", "test_metric"]

TEST_ROWS = 20_000
CNN_TARGET = "scripts.benchmarking.cnn:objective"


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # lightgbm | cnn | torch_mlp (ours only: the built-in objective as it is)
    what: str
    lightgbm: LightGBMObjectiveConfig = field(default_factory=LightGBMObjectiveConfig)

    def scaled(self, scale: float) -> Workload:
        """Fewer rows for a dry run (scale < 1); the CNN reads HPO_QUALITY_SCALE itself."""
        rows = max(2_000, int(self.lightgbm.n_rows * scale))
        return replace(self, lightgbm=replace(self.lightgbm, n_rows=rows))

    def overrides(self, device: str) -> list[str]:
        """``hpo-orchestrator run`` arguments that make the product run this workload."""
        if self.kind == "cnn":
            return ["objective=custom", f"objective.target={CNN_TARGET}"]
        if self.kind == "torch_mlp":
            return ["objective=torch_mlp"]
        cfg = self.lightgbm
        return ["objective=lightgbm", f"objective.n_rows={cfg.n_rows}",
                f"objective.n_features={cfg.n_features}",
                f"objective.num_boost_round={cfg.num_boost_round}",
                f"objective.report_every={cfg.report_every}", f"objective.device={device}"]


WORKLOADS = {
    "a": Workload("a", "lightgbm", "LightGBM, the default `make hpo` study: 40k x 40 generated "
                  "rows, 200 rounds, validation logloss every 10"),
    "b": Workload("b", "lightgbm", "LightGBM on 1M x 40 generated rows, 200 rounds, every 10",
                  LightGBMObjectiveConfig(n_rows=1_000_000)),
    "c": Workload("c", "cnn", "a small CNN on generated 3x32x32 images (torch), 10 epochs, "
                  "validation loss every epoch"),
    # the product's own torch_mlp at its defaults, for "no slower than before" (BEFORE in
    # bench_quality.py): only ours' contenders run it, and its targets come from a reference
    # run of one of them; no test metric (its validation loss is the measure)
    "t": Workload("t", "torch_mlp", "the built-in torch_mlp objective at its defaults: an MLP "
                  "on generated rows, 12 epochs, validation loss every epoch"),
}


def start_points(workload: Workload, seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` points of the workload's search space drawn at random from ``seed``: the
    same for every contender of that seed (``--common-start``), so that which side draws a
    good start-up point first is no longer part of the comparison (common random numbers)."""
    import optuna

    draws = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    if workload.kind == "cnn":
        from scripts.benchmarking.cnn import suggest

        return [suggest(draws.ask()) for _ in range(count)]
    if workload.kind == "torch_mlp":  # batch_size first, as the objective suggests it
        sizes = TorchMLPObjectiveConfig().batch_size
        points = []
        for _ in range(count):
            trial = draws.ask()
            batch = {"batch_size": trial.suggest_categorical("batch_size", sizes)} \
                if isinstance(sizes, list) else {}
            points.append({**batch, **suggest_all(trial, TORCH_MLP_SPACE)})
        return points
    return [suggest_all(draws.ask(), LIGHTGBM_SPACE) for _ in range(count)]


def _params(cfg: LightGBMObjectiveConfig, suggested: dict[str, Any], device: dict[str, Any],
            num_threads: int) -> dict[str, Any]:
    """LightGBM params exactly as objectives/lightgbm.py builds them for a binary task."""
    return {"objective": "binary", "metric": "binary_logloss", "verbosity": -1,
            "num_threads": num_threads, "max_bin": cfg.max_bin, "seed": cfg.seed,
            **suggested, "bagging_freq": 1, **device}


def _datasets(cfg: LightGBMObjectiveConfig, kept_for: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """New Datasets, binned in the trial's lgb.train; or, with ``kept_for`` (the params of the
    process's trials, less the suggested ones), binned now for every trial of the process, as
    objectives/lightgbm.py keeps its CPU and CUDA learners' (and Optuna's LightGBMTuner its own):
    feature_pre_filter off so that trials may lower min_child_samples, the raw arrays kept."""
    import lightgbm as lgb

    x_train, y_train, x_valid, y_valid = binary_classification(cfg.n_rows, cfg.n_features,
                                                               cfg.seed)
    if kept_for is None:
        train = lgb.Dataset(x_train, y_train, params={"max_bin": cfg.max_bin})
        return train, lgb.Dataset(x_valid, y_valid, reference=train)
    params = {"max_bin": cfg.max_bin, **kept_for, "feature_pre_filter": False}
    train = lgb.Dataset(x_train, y_train, params=params, free_raw_data=False)
    valid = lgb.Dataset(x_valid, y_valid, reference=train, params=params, free_raw_data=False)
    valid.construct()  # before any trial: threads (optuna-threads' n_jobs) must not race to it
    return train, valid


def lightgbm_objective(cfg: LightGBMObjectiveConfig, device: dict[str, Any],
                       num_threads: int, threaded: bool = False) -> Callable[[Any], float]:
    """An Optuna objective for Optuna's own processes. ``device``: LightGBM's device params
    ({"device_type": "cpu"}, or the NVIDIA OpenCL platform chosen by the caller)."""
    import lightgbm as lgb
    import optuna

    # The CPU and CUDA learners' Datasets binned once, as ours are (built with the learner's
    # device_type: one built for another cannot train there); OpenCL's per trial, as ours.
    # Threads of one process (``threaded``: optuna-threads) share the CPU's only: trainings
    # at once on one CUDA Dataset have not been checked on a GPU host.
    learner = device.get("device_type", "cpu")
    reused = learner == "cpu" or (learner == "cuda" and not threaded)
    kept = _datasets(cfg, _params(cfg, {}, device, num_threads)) if reused else None

    def objective(trial: Any) -> float:
        train, valid = kept or _datasets(cfg)
        params = _params(cfg, suggest_all(trial, LIGHTGBM_SPACE), device, num_threads)
        best = float("inf")

        def report(env: Any) -> None:
            nonlocal best
            if (env.iteration + 1) % cfg.report_every:
                return
            loss = float(env.evaluation_result_list[0][2])
            best = min(best, loss)
            trial.report(best, (env.iteration + 1) // cfg.report_every)  # what it returns
            if env.iteration + 1 + cfg.report_every <= env.end_iteration and trial.should_prune():
                raise optuna.TrialPruned(f"pruned at round {env.iteration + 1}")

        lgb.train(params, train, num_boost_round=cfg.num_boost_round, valid_sets=[valid],
                  callbacks=[report])
        return best

    return objective


def _logloss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_metric(workload: Workload, params: dict[str, Any], num_threads: int,
                trial_number: int = 0, device: dict[str, Any] | None = None) -> dict[str, Any]:
    """Retrain ``params`` once (LightGBM on ``device``: the CPU unless given) and read the
    held-out test loss at the report step with the lowest validation loss (the trial's value
    is that minimum). The CNN is seeded with the trial's number, as the trial was; LightGBM's
    seed is in its params."""
    if workload.kind == "cnn":
        from scripts.benchmarking.cnn import retrain_test_loss

        return retrain_test_loss(params, trial_number)
    import lightgbm as lgb

    cfg = workload.lightgbm
    train, valid = _datasets(cfg)
    log: dict[str, Any] = {}
    booster = lgb.train(_params(cfg, params, device or {"device_type": "cpu"}, num_threads), train,
                        num_boost_round=cfg.num_boost_round, valid_sets=[valid],
                        callbacks=[lgb.record_evaluation(log)])
    curve = log["valid_0"]["binary_logloss"]
    steps = range(cfg.report_every, cfg.num_boost_round + 1, cfg.report_every)
    best_round = min(steps, key=lambda r: curve[r - 1])
    x_test, y_test = held_out_test(cfg.n_rows, cfg.n_features, cfg.seed, TEST_ROWS)
    predicted = np.asarray(booster.predict(x_test, num_iteration=best_round))
    return {"test_logloss": _logloss(y_test, predicted),
            "valid_logloss": float(curve[best_round - 1]), "round": best_round}
