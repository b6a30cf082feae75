"""Sampler, pruner and study set-up from the validated config (all Optuna's own classes)."""

from __future__ import annotations

import optuna
from optuna.study import StudyDirection

from hpo_orchestrator.config import Config, to_plain_dict
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.storage import mask_url

__all__ = ["build_pruner", "build_sampler", "create_or_load_study"]


def build_pruner(config: Config, min_resource: int | None = None) -> optuna.pruners.BasePruner:
    """The configured pruner. With ``pruner.min_resource=auto`` the orchestrator passes the
    value it chose (hpo_orchestrator.pruning._auto); before it has one, nothing is pruned."""
    cfg = config.pruner
    if cfg.name == "patient_hyperband":
        if cfg.min_resource == "auto" and min_resource is None:
            return optuna.pruners.NopPruner()
        hyperband = optuna.pruners.HyperbandPruner(
            min_resource=min_resource or cfg.min_resource, max_resource=cfg.max_resource,
            reduction_factor=cfg.reduction_factor)
        return optuna.pruners.PatientPruner(hyperband, patience=cfg.patience,
                                            min_delta=cfg.min_delta)
    if cfg.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=cfg.n_startup_trials,
                                           n_warmup_steps=cfg.n_warmup_steps,
                                           interval_steps=cfg.interval_steps)
    return optuna.pruners.NopPruner()


def build_sampler(config: Config) -> optuna.samplers.BaseSampler:
    cfg = config.sampler
    if cfg.name == "tpe":
        return optuna.samplers.TPESampler(n_startup_trials=cfg.n_startup_trials, seed=cfg.seed)
    return optuna.samplers.RandomSampler(seed=cfg.seed)


def create_or_load_study(config: Config, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The study named in the config, created if new; an existing one must agree on direction."""
    name = config.study.name
    wanted = StudyDirection.MINIMIZE if config.study.direction == "minimize" \
        else StudyDirection.MAXIMIZE
    try:
        existing = storage.get_study_id_from_name(name)
    except KeyError:
        existing = None
    if existing is not None:
        directions = storage.get_study_directions(existing)
        if directions != [wanted]:
            have = ", ".join(d.name.lower() for d in directions)
            raise ConfigError(
                f"study {name!r} already exists with direction {have}, not {config.study.direction}",
                f"pass study.direction={have} or choose another study.name")
    study = optuna.create_study(storage=storage, study_name=name, direction=wanted,
                                sampler=build_sampler(config), pruner=build_pruner(config),
                                load_if_exists=True)
    resolved = to_plain_dict(config)
    resolved["storage"]["url"] = mask_url(resolved["storage"]["url"])  # never store a password
    study.set_user_attr("hpo.config", resolved)
    return study
