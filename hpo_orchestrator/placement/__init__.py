"""Placement: where a run's trials go.

The scheduler's settings decoded once (:class:`PlacementSettings`), the run's layout (its GPUs
and slots), GPU slots and their host-wide leases, the host's cores shared with other runs
(said, not leased: :class:`CoreShare`), and ``trials_per_gpu=auto``: the packing
rules (pure functions of measured numbers, placement/_rules.py), which trials measure a level
(placement/_trial_times.py) and the packer that feeds the rules and applies their verdicts.
The packer reads the run through narrow views (:class:`RunningView`, placement/_view.py),
never the loop's own objects.

This face imports no Optuna: a run lays out its slots and starts its first workers before
Optuna loads (scheduler/_first_wave.py).
"""

from __future__ import annotations

from hpo_orchestrator.placement._cores import CoreShare
from hpo_orchestrator.placement._layout import Layout, lay_out
from hpo_orchestrator.placement._leases import (
    LEASE_DIR_ENV,
    Lease,
    LeaseDir,
    default_lease_dir,
    describe_holder,
    user_name,
)
from hpo_orchestrator.placement._packer import Packer, forget_packing
from hpo_orchestrator.placement._settings import (
    PlacementSettings,
    Places,
    decode,
    host_cores,
    resolve_cpu_slots,
    resolve_parallel,
    threads_per_trial,
)
from hpo_orchestrator.placement._slots import BusyRule, Slot, SlotPool, resolve_gpus
from hpo_orchestrator.placement._view import Readings, RunningView, StudyAttrs

__all__ = ["LEASE_DIR_ENV", "BusyRule", "CoreShare", "Layout", "Lease", "LeaseDir", "Packer",
           "PlacementSettings", "Places", "Readings", "RunningView", "Slot", "SlotPool", "StudyAttrs",
           "decode", "default_lease_dir", "describe_holder", "forget_packing", "host_cores", "lay_out",
           "resolve_cpu_slots", "resolve_gpus", "resolve_parallel", "threads_per_trial", "user_name"]
