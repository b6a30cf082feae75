"""Pruner tuning from evidence: replay stored curves (``tune-pruner``) and choose
``pruner.min_resource`` from measured start-up and step times (``min_resource=auto``)."""

from __future__ import annotations

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

__all__ = ["PrunerSetting", "ReplayResult", "StudyCurves", "TrialCurve", "default_grid",
           "load_curves", "recommend", "replay", "tune"]
