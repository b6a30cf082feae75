"""Configuration: Hydra composition of ``conf/`` validated against structured dataclasses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpo_orchestrator.config import _search
from hpo_orchestrator.config._diff import MAX_SHOWN, value_differences
from hpo_orchestrator.config._schema import (
    ArtifactsConfig,
    Config,
    CustomObjectiveConfig,
    LightGBMObjectiveConfig,
    ObjectiveConfig,
    SchedulerConfig,
    StorageConfig,
    StudyConfig,
    TelemetryConfig,
    TorchMLPObjectiveConfig,
)

# Every sampler and pruner config, whatever config/_search.py exports: a new pruner is added
# there (docs/DESIGN.md §3.2), not here too.
from hpo_orchestrator.config._search import *  # noqa: F403
from hpo_orchestrator.config._space import (
    LIGHTGBM_SPACE,
    SPACES,
    TORCH_MLP_SPACE,
    ParamSpec,
    check_params,
    resolve_space,
)

if TYPE_CHECKING:
    from hpo_orchestrator.config._load import config_dir, load_config, to_plain_dict

__all__ = [
    "LIGHTGBM_SPACE",
    "MAX_SHOWN",
    "SPACES",
    "TORCH_MLP_SPACE",
    "ArtifactsConfig",
    "Config",
    "CustomObjectiveConfig",
    "LightGBMObjectiveConfig",
    "ObjectiveConfig",
    "ParamSpec",
    "SchedulerConfig",
    "StorageConfig",
    "StudyConfig",
    "TelemetryConfig",
    "TorchMLPObjectiveConfig",
    "check_params",
    "config_dir",
    "load_config",
    "resolve_space",
    "to_plain_dict",
    "value_differences",
    *_search.__all__,
]


def __getattr__(name: str) -> Any:
    """The loader on first use: a trial's child process imports the schema (its objective's
    config) and never loads a configuration (21 ms of its start: docs/DESIGN.md §3.2; Hydra
    itself, 0.4 s, is imported inside the loader's functions)."""
    if name in ("config_dir", "load_config", "to_plain_dict"):
        from hpo_orchestrator.config import _load

        return getattr(_load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
