"""Optuna pruners of our own, each built by its config (config/_search.py): successive halving
whose rungs the study's ranks choose (``pruner=ranked_halving``), and Hyperband's verdict
delayed by patience (``pruner.patience_mode=delay``). They import Optuna and nothing of the
project but each other, so the configs that build them can."""

from __future__ import annotations

from hpo_orchestrator.pruners._delayed import VERDICT, DelayedVerdictPruner, improving
from hpo_orchestrator.pruners._ranked import JUDGED, Ladder, RankedHalvingPruner, choose_ladder, goes_on

__all__ = ["JUDGED", "VERDICT", "DelayedVerdictPruner", "Ladder", "RankedHalvingPruner",
           "choose_ladder", "goes_on", "improving"]
