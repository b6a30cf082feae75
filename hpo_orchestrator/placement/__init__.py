"""Placement: where a run's trials go. GPU slots and their host-wide leases, the packing rules
(how many trials each GPU runs at once, pure functions of measured numbers) and the packer
that feeds them.
"""

from __future__ import annotations

from hpo_orchestrator.placement._leases import LEASE_DIR_ENV, Lease, LeaseDir, default_lease_dir
from hpo_orchestrator.placement._packer import Packer, forget_packing
from hpo_orchestrator.placement._slots import (
    BusyRule,
    Slot,
    SlotPool,
    host_cores,
    resolve_cpu_slots,
    resolve_gpus,
    resolve_parallel,
    threads_per_trial,
)

__all__ = ["LEASE_DIR_ENV", "BusyRule", "Lease", "LeaseDir", "Packer", "Slot", "SlotPool",
           "default_lease_dir", "forget_packing", "host_cores", "resolve_cpu_slots", "resolve_gpus",
           "resolve_parallel", "threads_per_trial"]
