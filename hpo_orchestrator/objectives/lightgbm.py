"""LightGBM on generated data (binary) or the user's table (``objective.data``: binary,
multiclass or regression), pruned every ``report_every`` boosting rounds.

On a GPU slot ``objective.device=auto`` (objectives/_device.py) trains on the CPU or on a GPU
learner, whichever it measured faster: LightGBM's CUDA learner where it was built with one,
else OpenCL (``device_type=gpu``) on NVIDIA's platform; either on device 0 of the pinned child.
The data is generated or read once per process, and binned once per learner (CPU, CUDA).
The effective parameters LightGBM really used (``device_type`` among them) are logged from the
model.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import optuna

from hpo_orchestrator.config import LIGHTGBM_SPACE, LightGBMObjectiveConfig, resolve_space
from hpo_orchestrator.gpu import choose_lightgbm_device, list_platforms
from hpo_orchestrator.objectives._device import Calibration, cuda_learner_available, picture
from hpo_orchestrator.objectives._generated import binary_classification
from hpo_orchestrator.objectives._suggest import suggest_all
from hpo_orchestrator.objectives._table import infer_task, load_table, split
from hpo_orchestrator.worker import phase, slot_info

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


# LightGBM's objective and validation metric per task (all minimized).
_TASKS = {"binary": ("binary", "binary_logloss"), "multiclass": ("multiclass", "multi_logloss"),
          "regression": ("regression", "l2")}


class LightGBMObjective:
    """Built from ``objective.*`` config; called once per trial. The user's table is read once
    per worker process (in reuse mode: once per slot); the generated data once per process
    (objectives/_generated.py caches it), so a reuse worker does not regenerate it per trial."""

    def __init__(self, config: LightGBMObjectiveConfig) -> None:
        # Imported here, not per call, so the import counts as start-up (hpo.startup_s).
        import lightgbm  # noqa: F401

        self.config = config
        self.space = resolve_space(LIGHTGBM_SPACE, config.search_space, "objective", config.name)
        self.task = "binary" if config.task == "auto" else config.task
        self.categorical: list[int] = []
        self.num_class = 1
        self.arrays: tuple[np.ndarray, ...] | None = None
        self.calibration = Calibration()  # objective.device=auto: measured once per picture
        self._cuda: tuple[bool, str | None] | None = None
        self._kept_datasets: dict[tuple[str, Any], tuple[Any, Any]] = {}  # see _datasets
        if config.data is not None:  # before the trial starts: counted in hpo.startup_s
            self._load(config.data, config.target_column or "")

    def _load(self, data: str, target_column: str) -> None:
        table = load_table(data, target_column)
        self.task = infer_task(table) if self.config.task == "auto" else self.config.task
        y = table.y
        if self.task != "regression":  # LightGBM wants classes coded 0..K-1
            classes, y = np.unique(y, return_inverse=True)
            self.num_class = len(classes)
        self.categorical = table.categorical
        self.arrays = split(replace(table, y=y.astype(np.float64)), self.config.valid_fraction,
                            self.config.seed)

    def _datasets(self, params: dict[str, Any]) -> tuple[Any, Any]:
        """The training and validation Datasets of a trial of ``params``.

        They are binned once per process and learner, with the study's params (its ``seed``
        picks LightGBM's bin sample, as in a trial's own lgb.train; no trial's suggested
        values), and reused by every trial on that learner. On the CPU that saved 12-15 % of a
        200-round trial on 2 threads (docs/BENCHMARKS.md). LightGBM's CUDA learner keeps its
        own copy of a Dataset on the GPU, built for the ``device_type`` the Dataset was
        constructed with (a CPU one cannot train there), so it gets its own pair, built once
        with ``device_type=cuda``: binning 1M rows again cost 0.6-0.8 s of every CUDA trial,
        half of a short one (docs/GPU.md, seventh session). ``feature_pre_filter`` is off so that a
        trial may lower ``min_child_samples`` below the one the Dataset was binned with;
        where the pre-filter would have dropped a feature (too rare to split), trials keep it
        among ``feature_fraction``'s draw, so on such data their models differ from
        LightGBM's default (on the generated data they are the same:
        tests/objectives/test_objective_data_once.py). The raw arrays (the cached ones) are kept so that
        LightGBM bins again itself if a trial changes how it bins. The OpenCL learner
        (``device_type=gpu``) gets new Datasets per trial: reusing one there has not been
        checked on a GPU host.
        """
        if params["device_type"] == "gpu":
            return self._bin({})
        learner = (params["device_type"], params.get("gpu_device_id"))  # a CUDA copy's device
        if learner not in self._kept_datasets:  # binned with the study's params only
            fixed = {k: v for k, v in params.items() if k not in self.space}
            kept = self._bin({**fixed, "feature_pre_filter": False}, keep_raw=True)
            kept[1].construct()  # and its reference: built here, not in a trial's lgb.train
            self._kept_datasets[learner] = kept
        return self._kept_datasets[learner]

    def _shape(self) -> tuple[int, int]:
        """Rows and features the trials train on (the user's table, or the generated data)."""
        if self.arrays is not None:
            rows, features = self.arrays[0].shape
            return int(rows), int(features)
        return self.config.n_rows, self.config.n_features

    def _bin(self, params: dict[str, Any], keep_raw: bool = False) -> tuple[Any, Any]:
        import lightgbm as lgb

        cfg = self.config
        if self.arrays is None:
            x_train, y_train, x_valid, y_valid = binary_classification(
                cfg.n_rows, cfg.n_features, cfg.seed)
        else:
            x_train, y_train, x_valid, y_valid = self.arrays
        # Text columns of the user's table, coded; LightGBM splits them as categories.
        categorical: list[int] | Literal["auto"] = self.categorical or "auto"
        params = {"max_bin": cfg.max_bin, **params}
        train = lgb.Dataset(x_train, y_train, params=params, categorical_feature=categorical,
                            free_raw_data=not keep_raw)
        # the same params as its reference: LightGBM warns where they differ
        return train, lgb.Dataset(x_valid, y_valid, reference=train, params=params,
                                  categorical_feature=categorical, free_raw_data=not keep_raw)

    def __call__(self, trial: Any) -> float:
        import lightgbm as lgb

        cfg = self.config
        slot = slot_info()
        objective, metric = _TASKS[self.task]
        params: dict[str, Any] = {
            "objective": objective,
            "metric": metric,
            "verbosity": -1,
            "num_threads": slot.num_threads,
            "max_bin": cfg.max_bin,
            "seed": cfg.seed,
            **suggest_all(trial, self.space),
            "bagging_freq": 1,
        }
        if self.task == "multiclass":
            params["num_class"] = self.num_class
        params.update(self._device_params(trial, slot, params))
        with phase("data"):
            train, valid = self._datasets(params)
        report_every = cfg.report_every
        best = float("inf")

        def report(env: Any) -> None:
            nonlocal best
            if (env.iteration + 1) % report_every:
                return
            loss = float(env.evaluation_result_list[0][2])
            best = min(best, loss)
            # the value the trial returns, so the pruner judges what the study would keep
            # (docs/OBJECTIVES.md, "What to report")
            trial.report(best, (env.iteration + 1) // report_every)
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

    def _gpu_learners(self, trial: Any, slot: Any) -> dict[str, dict[str, Any]]:
        """The GPU learners this trial's slot can run: the CUDA learner where this LightGBM has
        it (pinned by CUDA_VISIBLE_DEVICES, as torch is; LightGBM's maintainers recommend it
        over OpenCL on NVIDIA), OpenCL on NVIDIA's platform (found by name, §4) where there is
        no CUDA learner or ``objective.gpu_platform`` names a platform."""
        cfg = self.config
        if self._cuda is None:
            self._cuda = cuda_learner_available()
        cuda = {"cuda": {"device_type": "cuda", "gpu_device_id": 0}} if self._cuda[0] else {}
        if cuda and cfg.gpu_platform == "auto":  # OpenCL not weighed beside it (objectives/_device.py)
            return cuda
        choice = choose_lightgbm_device(slot.on_gpu, "gpu", cfg.gpu_platform, list_platforms())
        if choice.warning and not cuda:  # with CUDA there, OpenCL's troubles are no one's loss
            trial.set_user_attr("hpo.warning", choice.warning)
        opencl = {"gpu": choice.params} if choice.params.get("device_type") == "gpu" else {}
        return {**cuda, **opencl}

    def _device_params(self, trial: Any, slot: Any, params: dict[str, Any]) -> dict[str, Any]:
        """LightGBM's device params for this trial: ``objective.device`` obeyed when cpu or
        gpu; auto on a GPU slot measured (objectives/_device.py) and recorded as
        ``hpo.device_choice``."""
        cfg = self.config
        if cfg.device == "cpu" or not slot.on_gpu:
            if cfg.device == "gpu":
                raise ValueError("objective.device=gpu but this trial's slot has no GPU "
                                 "(scheduler.gpus=none or no GPU found)")
            return {"device_type": "cpu"}
        learners = self._gpu_learners(trial, slot)
        if cfg.device == "gpu":
            chosen = learners.get("cuda") or learners.get("gpu") or {"device_type": "cpu"}
        else:
            learners["cpu"] = {"device_type": "cpu"}

            def train_for(run_params: dict[str, Any], rounds: int, tick: Any) -> None:
                import lightgbm as lgb

                train, valid = self._datasets(run_params)  # as a trial gets them
                lgb.train(run_params, train, num_boost_round=rounds, valid_sets=[valid],
                          callbacks=[tick])

            def bin_for_cpu() -> None:  # untimed: later CPU trials reuse it (_datasets)
                self._datasets({**params, **learners["cpu"]})

            key = picture((cfg.data, cfg.n_rows, cfg.n_features), params)
            rows, features = self._shape()
            guessed = self.calibration.guess(key, list(learners), rows, features,
                                             cfg.num_boost_round, slot.num_threads)
            if guessed is not None:
                answer, measured = guessed, False
            else:
                with phase("calibrate"):
                    answer, measured = self.calibration.choose(
                        key, learners, params, train_for, cfg.num_boost_round, slot.num_threads,
                        prepare=bin_for_cpu)
            trial.set_user_attr("hpo.device_choice", {**answer, "measured_here": measured})
            chosen = learners[answer["learner"]]
        if chosen.get("device_type") == "gpu":
            platform = next((p.name for p in list_platforms() if p.id == chosen["gpu_platform_id"]),
                            None)
            if platform:
                trial.set_user_attr("hpo.opencl_platform", platform)
        return chosen
