"""Pruner tuning from evidence: replay stored curves (``tune-pruner``), choose
``pruner.min_resource`` from measured start-up and step times (``min_resource=auto``), and
switch the setting during a run from replays (``pruner.tune=auto``)."""

from __future__ import annotations

from hpo_orchestrator.pruning._auto import AutoPruner, fit_step_timing
from hpo_orchestrator.pruning._command import recommended_command
from hpo_orchestrator.pruning._factory import build_pruner
from hpo_orchestrator.pruning._render import LIMITS, render_tuning
from hpo_orchestrator.pruning._replay import (
    PrunerSetting,
    ReplayResult,
    StudyCurves,
    TrialCurve,
    default_grid,
    load_curves,
    recommend,
    replay,
    tune,
)
from hpo_orchestrator.pruning._tune_auto import PrunerTuner

__all__ = ["LIMITS", "AutoPruner", "PrunerSetting", "PrunerTuner", "ReplayResult", "StudyCurves",
           "TrialCurve", "build_pruner", "default_grid", "fit_step_timing", "load_curves", "recommend",
           "recommended_command", "render_tuning", "replay", "tune"]
