"""Configuration: Hydra composition of ``conf/`` validated against structured dataclasses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpo_orchestrator.config._diff import MAX_SHOWN, value_differences
from hpo_orchestrator.config._schema import (
    ArtifactsConfig,
    Config,
    CustomObjectiveConfig,
    HyperbandPrunerConfig,
    LightGBMObjectiveConfig,
    MedianPrunerConfig,
    NoPrunerConfig,
    ObjectiveConfig,
    PatientHyperbandPrunerConfig,
    PrunerConfig,
    RandomSamplerConfig,
    RankedHalvingPrunerConfig,
    SamplerConfig,
    SchedulerConfig,
    StorageConfig,
    StudyConfig,
    TelemetryConfig,
    TorchMLPObjectiveConfig,
    TPESamplerConfig,
)
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
    "HyperbandPrunerConfig",
    "LightGBMObjectiveConfig",
    "MedianPrunerConfig",
    "NoPrunerConfig",
    "ObjectiveConfig",
    "ParamSpec",
    "PatientHyperbandPrunerConfig",
    "PrunerConfig",
    "RandomSamplerConfig",
    "RankedHalvingPrunerConfig",
    "SamplerConfig",
    "SchedulerConfig",
    "StorageConfig",
    "StudyConfig",
    "TPESamplerConfig",
    "TelemetryConfig",
    "TorchMLPObjectiveConfig",
    "check_params",
    "config_dir",
    "load_config",
    "resolve_space",
    "to_plain_dict",
    "value_differences",
]


def __getattr__(name: str) -> Any:
    """Hydra is imported on first use of the loader: a trial's child process imports the
    schema (its objective's config) and must not pay Hydra's import (about 0.4 s)."""
    if name in ("config_dir", "load_config", "to_plain_dict"):
        from hpo_orchestrator.config import _load

        return getattr(_load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
