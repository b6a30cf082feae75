"""The one pruner factory: ``run`` builds the study's pruner with it, ``pruner.min_resource=auto``
rebuilds it with each value it chooses, and ``tune-pruner`` replays each grid setting through
it, so a replay judges trials exactly as a run with that setting would. What each pruner
builds is its config's own ``build`` (config/_search.py: a pruner is registered once)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator.config import PrunerConfig

if TYPE_CHECKING:
    import optuna

__all__ = ["build_pruner"]


def build_pruner(config: PrunerConfig, min_resource: int | None = None) -> optuna.pruners.BasePruner:
    """Optuna's pruner for ``config``. With ``min_resource=auto`` the caller passes the value
    it chose (hpo_orchestrator.pruning._auto); before it has one, nothing is pruned."""
    return config.build(min_resource)
