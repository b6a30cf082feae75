"""LightGBM binary classification, pruned every ``report_every`` boosting rounds.

On a GPU slot it trains with ``device_type=gpu`` on NVIDIA's OpenCL platform, device 0 of
the pinned child; the effective parameters LightGBM really used are logged from the model.
"""

from __future__ import annotations

import functools
from typing import Any

import optuna

from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
from hpo_orchestrator.gpu._opencl import choose_lightgbm_device, list_platforms
from hpo_orchestrator.objectives._data import binary_classification
from hpo_orchestrator.runtime import phase, slot_info

__all__ = ["LightGBMObjective", "compact_params", "effective_params"]

# Kept in hpo.params_effective whatever their value: where the model trained, and its threads.
_ALWAYS = ("device_type", "gpu_platform_id", "gpu_device_id", "num_threads")


def effective_params(model_text: str) -> dict[str, Any]:
    """The ``parameters:`` block of a LightGBM model dump: every parameter after alias
    resolution and defaults, i.e. what training really ran with."""
    params: dict[str, Any] = {}
    inside = False
    for line in model_text.splitlines():
        if line.strip() == "parameters:":
            inside = True
        elif line.strip() == "end of parameters":
            break
        elif inside and line.startswith("[") and ": " in line:
            key, _, value = line.strip("[]").partition(": ")
            params[key] = _parse_scalar(value)
    return params


@functools.cache
def _lightgbm_defaults() -> dict[str, Any]:
    """The parameter block of a model trained with LightGBM's defaults (binary objective, as
    ours), once per process: what the installed LightGBM would run with unless told."""
    import lightgbm as lgb
    import numpy as np

    x = np.arange(40, dtype=float).reshape(20, 2)
    booster = lgb.train({"objective": "binary", "verbosity": -1},
                        lgb.Dataset(x, np.arange(20) % 2), num_boost_round=1)
    return effective_params(booster.model_to_string(num_iteration=1))


def compact_params(full: dict[str, Any], suggested: set[str]) -> dict[str, Any]:
    """The model's parameter block without the ~100 keys at LightGBM's own default (they follow
    from ``lightgbm_version``), so ``optuna trials`` stays readable: kept are the keys that
    differ from the defaults, every suggested param (a suggestion that silently fell back to
    the default must still show: hpo.params_mismatch) and the device keys."""
    import lightgbm as lgb

    defaults = _lightgbm_defaults()
    kept = {k: v for k, v in full.items()
            if k in _ALWAYS or k in suggested or k not in defaults or defaults[k] != v}
    return {**kept, "lightgbm_version": lgb.__version__}


def _parse_scalar(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


class LightGBMObjective:
    """Built from ``objective.*`` config; called once per trial."""

    def __init__(self, config: LightGBMObjectiveConfig) -> None:
        # Imported here, not per call, so the import counts as start-up (hpo.startup_s).
        import lightgbm  # noqa: F401

        self.config = config

    def __call__(self, trial: Any) -> float:
        import lightgbm as lgb

        cfg = self.config
        slot = slot_info()
        with phase("data"):
            x_train, y_train, x_valid, y_valid = binary_classification(
                cfg.n_rows, cfg.n_features, cfg.seed)
            train = lgb.Dataset(x_train, y_train, params={"max_bin": cfg.max_bin})
            valid = lgb.Dataset(x_valid, y_valid, reference=train)

        choice = choose_lightgbm_device(slot.on_gpu, cfg.device, cfg.gpu_platform,
                                        list_platforms() if slot.on_gpu else [])
        if choice.platform:
            trial.set_user_attr("hpo.opencl_platform", choice.platform)
        if choice.warning:
            trial.set_user_attr("hpo.warning", choice.warning)

        params: dict[str, Any] = {
            "objective": "binary",
            "metric": "binary_logloss",
            "verbosity": -1,
            "num_threads": slot.num_threads,
            "max_bin": cfg.max_bin,
            "seed": cfg.seed,
            "num_leaves": trial.suggest_int("num_leaves", 8, 256, log=True),
            "max_depth": trial.suggest_int("max_depth", 3, 12),
            "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.3, log=True),
            "min_child_samples": trial.suggest_int("min_child_samples", 5, 100, log=True),
            "feature_fraction": trial.suggest_float("feature_fraction", 0.4, 1.0),
            "bagging_fraction": trial.suggest_float("bagging_fraction", 0.4, 1.0),
            "bagging_freq": 1,
            "lambda_l1": trial.suggest_float("lambda_l1", 1e-8, 10.0, log=True),
            "lambda_l2": trial.suggest_float("lambda_l2", 1e-8, 10.0, log=True),
            **choice.params,
        }
        report_every = cfg.report_every
        best = float("inf")

        def report(env: Any) -> None:
            nonlocal best
            if (env.iteration + 1) % report_every:
                return
            loss = float(env.evaluation_result_list[0][2])
            best = min(best, loss)
            trial.report(loss, (env.iteration + 1) // report_every)
            # A trial at its last step has done all its work: it completes with its value.
            if env.iteration + 1 + report_every <= env.end_iteration and trial.should_prune():
                trial.set_user_attr("hpo.params_effective", compact_params(
                    effective_params(env.model.model_to_string(num_iteration=1)), set(params)))
                raise optuna.TrialPruned(f"pruned at round {env.iteration + 1}")

        with phase("train"):
            booster = lgb.train(params, train, num_boost_round=cfg.num_boost_round,
                                valid_sets=[valid], callbacks=[report])
        trial.set_user_attr("hpo.params_effective", compact_params(
            effective_params(booster.model_to_string(num_iteration=1)), set(params)))
        return best
