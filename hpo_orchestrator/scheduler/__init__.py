"""Scheduling: slots (GPU pinning, host-wide leases), the shared trial budget, a run's layout and
its first workers, and the orchestrator that runs trials on them.

This face imports no Optuna: a run lays out its slots and starts its first workers
(scheduler/_first_wave.py) before it imports Optuna and the orchestrator, so the workers'
start-up runs beside those imports. The orchestrator's loop, which imports Optuna, is the
public module ``hpo_orchestrator.scheduler.orchestrator``: the run (runner.py) imports it by
name once the first wave is under way.
"""

from __future__ import annotations

from hpo_orchestrator.scheduler._budget import Budget, count_claimed
from hpo_orchestrator.scheduler._first_wave import FirstWave, Layout, lay_out
from hpo_orchestrator.scheduler._leases import LeaseDir, default_lease_dir, describe_holder, user_name
from hpo_orchestrator.scheduler._logs import read_tail, run_dir
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

__all__ = ["Budget", "BusyRule", "FinishedTrial", "FirstWave", "Layout", "LeaseDir", "QuietReporter",
           "Reporter", "RunningTrial", "Slot", "SlotPool", "count_claimed", "default_lease_dir",
           "describe_holder", "lay_out", "read_tail", "resolve_cpu_slots", "resolve_gpus",
           "resolve_parallel", "run_dir", "threads_per_trial", "user_name"]
