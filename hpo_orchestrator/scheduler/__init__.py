"""Scheduling: slots (GPU pinning) and the orchestrator that runs trials on them."""

from __future__ import annotations

from hpo_orchestrator.scheduler._orchestrator import (
    FinishedTrial,
    Orchestrator,
    Reporter,
    RunningTrial,
    count_claimed,
    params_mismatch,
)
from hpo_orchestrator.scheduler._slots import Slot, SlotPool, resolve_gpus, threads_per_trial

__all__ = ["FinishedTrial", "Orchestrator", "Reporter", "RunningTrial", "Slot", "SlotPool",
           "count_claimed", "params_mismatch", "resolve_gpus", "threads_per_trial"]
