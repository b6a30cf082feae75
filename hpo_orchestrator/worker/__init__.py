"""Trial child processes: the bootstrap that runs an objective, the trial proxy, and what an
objective can learn about and tell the orchestrator (``phase``, ``slot_info``).

Light on purpose: ``from hpo_orchestrator import phase`` imports this package in every
objective's process, so the bootstrap (it imports Optuna) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpo_orchestrator.worker._env import SLOT, ChildEnv
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
from hpo_orchestrator.worker._reaping import become_subreaper, restore_subreaper
from hpo_orchestrator.worker._runtime import (
    SlotInfo,
    artifact_store,
    orchestrator_link,
    phase,
    phase_depth,
    slot_info,
)
from hpo_orchestrator.worker._study_view import NotInTrialProcess

if TYPE_CHECKING:
    from hpo_orchestrator.worker._child import import_target

__all__ = ["ARTIFACT_CALL", "OBJECTIVE_ATTRS", "READ_CALLS", "SLOT", "TRIAL_METHODS", "ChildEnv", "Job",
           "NotInTrialProcess", "Prepare", "SlotInfo", "TrialOutcome", "TrialProxy", "artifact_store",
           "become_subreaper",
           "import_target", "orchestrator_link", "phase", "phase_depth", "restore_subreaper",
           "slot_info"]


def __getattr__(name: str) -> Any:
    if name == "import_target":
        from hpo_orchestrator.worker._child import import_target

        return import_target
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
