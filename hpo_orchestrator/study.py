"""Sampler, pruner and study set-up from the validated config (all Optuna's own classes)."""

from __future__ import annotations

import optuna
from optuna.study import StudyDirection

from hpo_orchestrator.config import Config, TPESamplerConfig, to_plain_dict
from hpo_orchestrator.db import mask_url
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.pruning._factory import build_pruner

__all__ = ["build_sampler", "create_or_load_study"]


def build_sampler(config: Config) -> optuna.samplers.BaseSampler:
    cfg = config.sampler
    if isinstance(cfg, TPESamplerConfig):
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
                                sampler=build_sampler(config), pruner=build_pruner(config.pruner),
                                load_if_exists=True)
    resolved = to_plain_dict(config)
    resolved["storage"]["url"] = mask_url(resolved["storage"]["url"])  # never store a password
    study.set_user_attr("hpo.config", resolved)
    return study
