"""Trial child processes: the bootstrap that runs an objective, and the trial proxy."""

from __future__ import annotations

from hpo_orchestrator.worker._protocol import (
    ARTIFACT_CALL,
    OBJECTIVE_ATTRS,
    READ_CALLS,
    TRIAL_METHODS,
    Job,
    Prepare,
    TrialOutcome,
)
from hpo_orchestrator.worker._proxy import TrialProxy
from hpo_orchestrator.worker._study_view import NotInTrialProcess

__all__ = ["ARTIFACT_CALL", "OBJECTIVE_ATTRS", "READ_CALLS", "TRIAL_METHODS", "Job",
           "NotInTrialProcess", "Prepare", "TrialOutcome", "TrialProxy"]
