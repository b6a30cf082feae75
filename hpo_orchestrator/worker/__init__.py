"""Trial child processes: the bootstrap that runs an objective, and the trial proxy."""

from __future__ import annotations

from hpo_orchestrator.worker._protocol import (
    ARTIFACT_CALL,
    OBJECTIVE_ATTRS,
    TRIAL_METHODS,
    Job,
    Prepare,
    TrialOutcome,
)
from hpo_orchestrator.worker._proxy import TrialProxy

__all__ = ["ARTIFACT_CALL", "OBJECTIVE_ATTRS", "TRIAL_METHODS", "Job", "Prepare", "TrialOutcome",
           "TrialProxy"]
