"""Configuration: Hydra composition of ``conf/`` validated against structured dataclasses."""

from __future__ import annotations

from hpo_orchestrator.config._load import config_dir, load_config, to_plain_dict
from hpo_orchestrator.config._schema import (
    Config,
    CustomObjectiveConfig,
    LightGBMObjectiveConfig,
    MedianPrunerConfig,
    NoPrunerConfig,
    PatientHyperbandPrunerConfig,
    RandomSamplerConfig,
    SchedulerConfig,
    StorageConfig,
    StudyConfig,
    TelemetryConfig,
    TorchMLPObjectiveConfig,
    TPESamplerConfig,
)

__all__ = [
    "Config",
    "CustomObjectiveConfig",
    "LightGBMObjectiveConfig",
    "MedianPrunerConfig",
    "NoPrunerConfig",
    "PatientHyperbandPrunerConfig",
    "RandomSamplerConfig",
    "SchedulerConfig",
    "StorageConfig",
    "StudyConfig",
    "TPESamplerConfig",
    "TelemetryConfig",
    "TorchMLPObjectiveConfig",
    "config_dir",
    "load_config",
    "to_plain_dict",
]
