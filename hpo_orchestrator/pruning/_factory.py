"""The one pruner factory: ``run`` builds the study's pruner with it, ``pruner.min_resource=auto``
rebuilds it with each value it chooses, and ``tune-pruner`` replays each grid setting through
it, so a replay judges trials exactly as a run with that setting would."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator.config import (
    HyperbandPrunerConfig,
    MedianPrunerConfig,
    PatientHyperbandPrunerConfig,
    PrunerConfig,
    RankedHalvingPrunerConfig,
)

if TYPE_CHECKING:
    import optuna

__all__ = ["build_pruner"]


def build_pruner(config: PrunerConfig, min_resource: int | None = None) -> optuna.pruners.BasePruner:
    """Optuna's pruner for ``config``. With ``min_resource=auto`` the caller passes the value
    it chose (hpo_orchestrator.pruning._auto); before it has one, nothing is pruned."""
    import optuna  # deferred: `status` and `report` import this package and start fast

    if isinstance(config, PatientHyperbandPrunerConfig):
        if config.min_resource == "auto" and min_resource is None:
            return optuna.pruners.NopPruner()
        hyperband = optuna.pruners.HyperbandPruner(
            min_resource=min_resource or config.min_resource, max_resource=config.max_resource,
            reduction_factor=config.reduction_factor)
        return optuna.pruners.PatientPruner(hyperband, patience=config.patience,
                                            min_delta=config.min_delta)
    if isinstance(config, HyperbandPrunerConfig):
        return optuna.pruners.HyperbandPruner(
            min_resource=config.min_resource, max_resource=config.max_resource,
            reduction_factor=config.reduction_factor)
    if isinstance(config, RankedHalvingPrunerConfig):
        from hpo_orchestrator.pruning._ranked import RankedHalvingPruner

        return RankedHalvingPruner(reduction_factors=config.reduction_factors, protect=config.protect,
                                   min_complete=config.min_complete, audit_every=config.audit_every)
    if isinstance(config, MedianPrunerConfig):
        return optuna.pruners.MedianPruner(n_startup_trials=config.n_startup_trials,
                                           n_warmup_steps=config.n_warmup_steps,
                                           interval_steps=config.interval_steps)
    return optuna.pruners.NopPruner()
