"""Optuna pruners of our own, each built by its config (config/_search.py): successive halving
whose rungs the study's ranks choose (``pruner=ranked_halving``), Hyperband's verdict
delayed by patience (``pruner.patience_mode=delay``), and patience that does not shield a
trial out of reach of the study's best (``pruner.patience_mode=reach``). They import Optuna and nothing of the
project but each other, so the configs that build them can."""

from __future__ import annotations

from hpo_orchestrator.pruners._delayed import VERDICT, DelayedVerdictPruner, improving
from hpo_orchestrator.pruners._ranked import JUDGED, Ladder, RankedHalvingPruner, choose_ladder, goes_on
from hpo_orchestrator.pruners._reach import OutOfReachPruner, out_of_reach

__all__ = ["JUDGED", "VERDICT", "DelayedVerdictPruner", "Ladder", "OutOfReachPruner",
           "RankedHalvingPruner", "choose_ladder", "goes_on", "improving", "out_of_reach"]
