"""Scheduling: slots (GPU pinning, host-wide leases), the shared trial budget, and the
orchestrator that runs trials on them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator._lazy import lazy_getattr

# Each name is imported from its module on first use (PEP 562): a run lays out its slots and
# starts its first workers (scheduler/_first_wave.py) before it imports the orchestrator,
# Optuna and SQLAlchemy, so the workers' start-up runs beside those imports.
if TYPE_CHECKING:
    from hpo_orchestrator.scheduler._budget import Budget, count_claimed
    from hpo_orchestrator.scheduler._first_wave import FirstWave, Layout, lay_out
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

_MODULES = {
    "Budget": "_budget", "count_claimed": "_budget", "FirstWave": "_first_wave", "Layout": "_first_wave",
    "lay_out": "_first_wave", "LeaseDir": "_leases", "default_lease_dir": "_leases",
    "read_tail": "_logs", "run_dir": "_logs", "Orchestrator": "_orchestrator",
    "params_mismatch": "_outcome",
    **dict.fromkeys(["BusyRule", "Slot", "SlotPool", "resolve_cpu_slots", "resolve_gpus",
                     "resolve_parallel", "threads_per_trial"], "_slots"),
    **dict.fromkeys(["FinishedTrial", "QuietReporter", "Reporter", "RunningTrial"], "_trial"),
}

__all__ = [
    "Budget",
    "BusyRule",
    "FinishedTrial",
    "FirstWave",
    "Layout",
    "LeaseDir",
    "Orchestrator",
    "QuietReporter",
    "Reporter",
    "RunningTrial",
    "Slot",
    "SlotPool",
    "count_claimed",
    "default_lease_dir",
    "lay_out",
    "params_mismatch",
    "read_tail",
    "resolve_cpu_slots",
    "resolve_gpus",
    "resolve_parallel",
    "run_dir",
    "threads_per_trial",
]

__getattr__ = lazy_getattr(__name__, _MODULES, globals())
