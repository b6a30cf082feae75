"""Sampler, pruner and study set-up from the validated config (all Optuna's own classes), and
the params ``study.enqueue`` queues at a run's start."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import optuna
from optuna.study import StudyDirection
from sqlalchemy.engine import Engine

from hpo_orchestrator import keys
from hpo_orchestrator.config import (
    MAX_SHOWN,
    SPACES,
    Config,
    NoPrunerConfig,
    ParamSpec,
    TPESamplerConfig,
    check_params,
    to_plain_dict,
    value_differences,
)
from hpo_orchestrator.db import study_space
from hpo_orchestrator.db.connect import mask_url
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.pruning import build_pruner

__all__ = ["build_sampler", "create_or_load_study", "enqueue_configured", "objective_differences",
           "record_config", "trials_space", "without_pruning"]

# Objective keys that change where or how fast a trial runs, not what it computes: a study may
# go on with other values. Every other key (name, target, data, sizes, seeds, search space)
# defines the problem, and trials of two problems are not comparable in one study.
_HOW_NOT_WHAT = frozenset({"device", "gpu_platform", "num_workers", "pin_memory",
                           "persistent_workers", "prefetch_factor", "setup"})


def build_sampler(config: Config) -> optuna.samplers.BaseSampler:
    cfg = config.sampler
    if isinstance(cfg, TPESamplerConfig):
        # Multivariate TPE samples a parameter outside the trials' common search space (a
        # conditional one) on its own; Optuna 5 does so silently (warn_independent_sampling
        # defaults to off, and passing it is deprecated): tests/study/test_sampler_defaults.py
        return optuna.samplers.TPESampler(n_startup_trials=cfg.n_startup_trials, seed=cfg.seed,
                                          multivariate=cfg.multivariate,
                                          constant_liar=cfg.constant_liar)
    return optuna.samplers.RandomSampler(seed=cfg.seed)


def without_pruning(config: Config) -> tuple[Config, str | None]:
    """A study of several objectives runs with ``pruner=none``, and the line that says so.

    Optuna cannot prune them (``Trial.report``/``should_prune`` raise), and the pruner group
    always has a default: refusing would fail every multi-objective run that did not also
    type ``pruner=none`` (docs/DESIGN.md §3.9)."""
    if not config.study.multi_objective or isinstance(config.pruner, NoPrunerConfig):
        return config, None
    notice = (f"pruner: off (was {config.pruner.name}): Optuna cannot prune a study of "
              f"{len(config.study.objectives)} objectives; trials run to their end and their "
              f"reports are kept as curves. Pass pruner=none to say so yourself.")
    return replace(config, pruner=NoPrunerConfig()), notice


def create_or_load_study(config: Config, storage: optuna.storages.BaseStorage,
                         record: bool = True) -> optuna.Study:
    """The study named in the config, created if new; an existing one must agree on its
    directions. ``record``: the config as its hpo.config now, else only for a study without
    one (the runner records it once it knows the run has trials to run)."""
    name = config.study.name
    wanted = [StudyDirection.MINIMIZE if d == "minimize" else StudyDirection.MAXIMIZE
              for d in config.study.objectives]
    try:
        existing = storage.get_study_id_from_name(name)
    except KeyError:
        existing = None
    if existing is not None:
        directions = storage.get_study_directions(existing)
        if directions != wanted:
            have = [d.name.lower() for d in directions]
            asked = ",".join(config.study.objectives)
            pass_ = f"study.direction={have[0]}" if len(have) == 1 else \
                f"study.directions=[{','.join(have)}]"
            raise ConfigError(
                f"study {name!r} already exists with direction {', '.join(have)}, not {asked}",
                f"pass {pass_} or choose another study.name")
        recorded = (storage.get_study_user_attrs(existing).get(keys.CONFIG) or {}).get("objective")
        differences = objective_differences(recorded, to_plain_dict(config)["objective"])
        if differences and not config.study.allow_mixed:
            shown = differences[:MAX_SHOWN] + ([f"and {len(differences) - MAX_SHOWN} more"]
                                               if len(differences) > MAX_SHOWN else [])
            raise ConfigError(
                f"study {name!r} was run with another objective ({'; '.join(shown)}): "
                f"this run's trials would be mixed with its trials",
                f"choose another study.name (study.name={name}-2), or pass study.allow_mixed=true "
                "to add them anyway")
    study = optuna.create_study(storage=storage, study_name=name, directions=wanted,
                                sampler=build_sampler(config), pruner=build_pruner(config.pruner),
                                load_if_exists=True)
    if record or keys.CONFIG not in study.user_attrs:  # a new study has its record at once
        record_config(study, config)
    return study


def record_config(study: optuna.Study, config: Config) -> None:
    """The resolved config as the study attr hpo.config (password masked)."""
    resolved = to_plain_dict(config)
    resolved["storage"]["url"] = mask_url(resolved["storage"]["url"])  # never store a password
    study.set_user_attr(keys.CONFIG, resolved)


def objective_differences(recorded: dict[str, Any] | None, wanted: dict[str, Any]) -> list[str]:
    """What makes ``wanted`` another problem than the study's ``recorded`` objective, as
    ``key: recorded -> wanted`` (nothing when the study has no record: made elsewhere)."""
    if not recorded:
        return []
    if recorded.get("name") != wanted.get("name"):
        return [f"objective: {_show(recorded, 'name')} -> {_show(wanted, 'name')}"]
    # Keys one side lacks come from another release of this package: not a difference.
    shared = sorted((set(recorded) & set(wanted)) - _HOW_NOT_WHAT)
    return [line for key in shared  # a search space: only what changed in it (config/_diff.py)
            for line in value_differences(f"objective.{key}", recorded[key], wanted[key])]


def _show(section: dict[str, Any], key: str) -> str:
    return repr(section[key])


def trials_space(distributions: dict[str, str]) -> dict[str, ParamSpec]:
    """The search space a study's trials used ({name: Optuna distribution JSON}, db's
    study_space), as the built-in objectives' spaces are written (config/_space.py)."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
        json_to_distribution,
    )

    space = {}
    for name, text in distributions.items():
        found = json_to_distribution(text)
        if isinstance(found, CategoricalDistribution):
            space[name] = ParamSpec(name, "categorical", choices=tuple(found.choices))
        elif isinstance(found, IntDistribution):  # every integer is on a step of 1
            space[name] = ParamSpec(name, "int", found.low, found.high, found.log,
                                    None if found.step == 1 else found.step)
        elif isinstance(found, FloatDistribution):
            space[name] = ParamSpec(name, "float", found.low, found.high, found.log, found.step)
    return space


def enqueue_configured(study: optuna.Study, entries: list[dict[str, Any]], objective: str,
                       engine: Engine) -> int:
    """``study.enqueue`` at a run's start: each entry once per study (a resumed run, or a
    second orchestrator, finds it and skips it). Returns how many were added. The config's
    check knew a built-in objective's space; another objective's is known from the study's
    trials, once it has some (checked here, before any entry is written)."""
    if not entries:
        return 0
    if objective not in SPACES:
        with engine.connect() as connection:
            tried = trials_space(study_space(connection, study._study_id))
        check_params(entries, objective, None, "study.enqueue", tried)
    before = len(study.get_trials(deepcopy=False))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        for entry in entries:
            study.enqueue_trial(dict(entry), skip_if_exists=True)
    return len(study.get_trials(deepcopy=False)) - before
