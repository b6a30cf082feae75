"""The built-in and custom objectives' configs (``objective.*``), re-exported by _schema.

A trial's child unpickles its objective's config from here: no Hydra or OmegaConf import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpo_orchestrator.config._checks import _positive_int, _require
from hpo_orchestrator.config._datafile import check_data_file
from hpo_orchestrator.config._space import (
    LIGHTGBM_SPACE,
    TORCH_MLP_SPACE,
    SpaceEntry,
    as_config,
    check_space,
)

__all__ = ["CustomObjectiveConfig", "LightGBMObjectiveConfig", "TorchMLPObjectiveConfig"]


@dataclass
class LightGBMObjectiveConfig:
    """GBDT with pruning: binary classification on a generated data set (fixed seed), or the
    user's own table (``data``, ``target_column``)."""

    name: str = "lightgbm"
    n_rows: int = 40_000
    n_features: int = 40
    num_boost_round: int = 200
    report_every: int = 10  # boosting rounds between two pruning checks (one "step")
    # auto: on a GPU slot, whichever of the CPU (the slot's threads) and the GPU learners
    # (CUDA where LightGBM has it, OpenCL on NVIDIA's platform) a short measurement on this
    # study's data finds faster (hpo.device_choice; docs/DESIGN.md §4); the CPU on a CPU slot.
    # cpu / gpu force it (gpu: CUDA where it exists, else OpenCL).
    device: str = "auto"
    # auto: find the NVIDIA OpenCL platform by name; an integer forces a platform id.
    gpu_platform: Any = "auto"
    max_bin: int = 63  # the value LightGBM recommends for its GPU learner
    seed: int = 0
    # Your own data instead of the generated set: a CSV (or Parquet, with pyarrow) file with a
    # header, and the column to predict; n_rows and n_features then do not apply.
    data: str | None = None
    target_column: str | None = None
    # auto: binary, multiclass or regression from the target's values.
    task: str = "auto"
    valid_fraction: float = 0.2  # rows held out (seeded shuffle) for the validation metric
    # Per parameter (config/_space.py): low/high (log, step), or choices, or a fixed value.
    search_space: dict[str, SpaceEntry] = field(default_factory=lambda: as_config(LIGHTGBM_SPACE))

    def validate(self, path: str) -> None:
        check_space(LIGHTGBM_SPACE, self.search_space, path, self.name)
        _require(self.task in ("auto", "binary", "multiclass", "regression"), f"{path}.task",
                 f"expected auto, binary, multiclass or regression, got {self.task!r}")
        _require(isinstance(self.valid_fraction, (int, float)) and 0 < self.valid_fraction < 1,
                 f"{path}.valid_fraction",
                 f"expected a share between 0 and 1, got {self.valid_fraction!r}")
        # Made absolute here, once: the children and hpo.config then name the same file.
        self.data = check_data_file(self.data, self.target_column, path, self.task)
        for key in ("n_rows", "n_features", "num_boost_round", "report_every", "max_bin"):
            _positive_int(getattr(self, key), f"{path}.{key}")
        _require(self.n_rows >= 100, f"{path}.n_rows", f"expected at least 100 rows, got {self.n_rows}")
        _require(self.device in ("auto", "cpu", "gpu"), f"{path}.device",
                 f"expected auto, cpu or gpu, got {self.device!r}")
        _require(self.gpu_platform == "auto" or (isinstance(self.gpu_platform, int)
                                                 and self.gpu_platform >= 0),
                 f"{path}.gpu_platform",
                 f"expected auto or a platform id >= 0, got {self.gpu_platform!r}")


@dataclass
class TorchMLPObjectiveConfig:
    """An MLP trained on generated data with a real DataLoader loop; bf16 autocast on GPU."""

    name: str = "torch_mlp"
    n_samples: int = 20_000
    n_features: int = 64
    epochs: int = 12
    # A list is searched (categorical); a single value is fixed.
    batch_size: Any = field(default_factory=lambda: [64, 128, 256, 512])
    num_workers: int = 0
    pin_memory: bool = True
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    bf16: bool = True
    seed: int = 0
    search_space: dict[str, SpaceEntry] = field(default_factory=lambda: as_config(TORCH_MLP_SPACE))

    def validate(self, path: str) -> None:
        check_space(TORCH_MLP_SPACE, self.search_space, path, self.name)
        for key in ("n_samples", "n_features", "epochs"):
            _positive_int(getattr(self, key), f"{path}.{key}")
        sizes = self.batch_size if isinstance(self.batch_size, list) else [self.batch_size]
        _require(bool(sizes) and all(isinstance(b, int) and b >= 1 for b in sizes),
                 f"{path}.batch_size",
                 f"expected a positive integer or a list of them, got {self.batch_size!r}")
        _positive_int(self.num_workers, f"{path}.num_workers", minimum=0)
        if self.prefetch_factor is not None:
            _positive_int(self.prefetch_factor, f"{path}.prefetch_factor")
            _require(self.num_workers > 0, f"{path}.prefetch_factor",
                     "only applies with num_workers > 0",
                     "set objective.num_workers=2 (or more), or drop prefetch_factor")
        _require(not self.persistent_workers or self.num_workers > 0,
                 f"{path}.persistent_workers", "only applies with num_workers > 0")


@dataclass
class CustomObjectiveConfig:
    """A plain Optuna ``def objective(trial)`` given as ``package.module:function``."""

    name: str = "custom"
    target: str = ""
    # Optional per-worker set-up, ``package.module:function``, called once before the trial.
    setup: str | None = None

    def validate(self, path: str) -> None:
        _require(bool(self.target), f"{path}.target", "is required for objective=custom",
                 "pass objective.target=package.module:function")
        _require(self.target.count(":") == 1, f"{path}.target",
                 f"expected package.module:function, got {self.target!r}")
