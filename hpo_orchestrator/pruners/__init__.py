"""Optuna pruners of our own, each built by its config (config/_search.py): successive halving
whose rungs the study's ranks choose (``pruner=ranked_halving``). They import Optuna and
nothing of the project, so the configs that build them can."""

from __future__ import annotations

from hpo_orchestrator.pruners._ranked import JUDGED, Ladder, RankedHalvingPruner, choose_ladder, goes_on

__all__ = ["JUDGED", "Ladder", "RankedHalvingPruner", "choose_ladder", "goes_on"]
