"""A run's layout: its settings decoded once (placement/_settings.py), its GPUs and slots.

Laid out right after the configuration is loaded, before Optuna and the storage
(scheduler/_first_wave.py starts the first workers on it): nothing here imports Optuna.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from hpo_orchestrator.config import Config
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import GpuBackend, GpuInfo
from hpo_orchestrator.placement._cores import CoreShare
from hpo_orchestrator.placement._leases import LeaseDir, default_lease_dir
from hpo_orchestrator.placement._settings import PlacementSettings, decode, host_cores, objective_key
from hpo_orchestrator.placement._slots import BusyRule, SlotPool, resolve_gpus

__all__ = ["Layout", "lay_out"]


@dataclass(frozen=True)
class Layout:
    """Where the run's trials go: its settings and its slots, and its presence on the host's
    cores (placement/_cores.py: announced by the first wave, read by the loop)."""

    settings: PlacementSettings
    slots: SlotPool
    cores: CoreShare

    @property
    def gpus(self) -> list[GpuInfo]:
        return list(self.settings.gpus)

    @property
    def threads(self) -> int:
        """CPU threads per trial at the start."""
        return self.settings.threads_at(self.slots.concurrency)

    @property
    def parallel_reason(self) -> str:
        """Why slots.concurrency: scheduler.parallel, or what its default chose."""
        return self.settings.parallel_reason


def lay_out(config: Config, backend: GpuBackend, run_folder: Path) -> Layout:
    """The slots of ``config``'s scheduler on this host (ConfigError where they cannot be)."""
    sched = config.scheduler
    gpus = resolve_gpus(sched.gpus, backend)
    leases = LeaseDir(default_lease_dir(sched.lease_dir))
    if gpus:  # only GPU slots are leased
        leases.check()
    settings = decode(sched, gpus, cores=host_cores(sched.host_cores),
                      host=sched.host or socket.gethostname(), run_folder=run_folder,
                      objective=objective_key(config.objective))
    if settings.places.cpu_slots and gpus and getattr(config.objective, "device", None) == "gpu":
        raise ConfigError(f"scheduler.cpu_slots={sched.cpu_slots} with objective.device=gpu: "
                          "a trial on a CPU slot cannot train on a GPU",
                          "leave objective.device=auto (each trial where it runs faster), or "
                          "set scheduler.cpu_slots=0")
    slots = SlotPool(settings.places, leases=leases,
                     backend=backend if sched.avoid_busy_gpus else None,
                     busy=BusyRule(sched.busy_gpu_mem_mib, sched.busy_gpu_util))
    # its trials on CPU slots: every slot of a host without GPUs, else the CPU slots beside them
    on_cpu = min(slots.cpu_places, slots.concurrency) if gpus else slots.concurrency
    cores = CoreShare(leases, os.sched_getaffinity(0), on_cpu,
                      settings.threads_at(slots.concurrency), config.study.name, settings.host)
    return Layout(settings, slots, cores)
