"""Scheduling: slots (GPU pinning, host-wide leases), the shared trial budget, and the
orchestrator that runs trials on them."""

from __future__ import annotations

from hpo_orchestrator.scheduler._budget import Budget
from hpo_orchestrator.scheduler._leases import LeaseDir, default_lease_dir
from hpo_orchestrator.scheduler._logs import read_tail, run_dir
from hpo_orchestrator.scheduler._orchestrator import Orchestrator
from hpo_orchestrator.scheduler._outcome import params_mismatch
from hpo_orchestrator.scheduler._slots import (
    BusyRule,
    Slot,
    SlotPool,
    resolve_cpu_slots,
    resolve_gpus,
    resolve_parallel,
    threads_per_trial,
)
from hpo_orchestrator.scheduler._trial import FinishedTrial, QuietReporter, Reporter, RunningTrial

__all__ = ["Budget", "BusyRule", "FinishedTrial", "LeaseDir", "Orchestrator", "QuietReporter", "Reporter",
           "RunningTrial", "Slot", "SlotPool", "default_lease_dir", "params_mismatch",
           "read_tail", "resolve_cpu_slots", "resolve_gpus", "resolve_parallel", "run_dir",
           "threads_per_trial"]
