"""Slots: the places a trial can run (GPU x trials_per_gpu, or CPU slots)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import GpuBackend, GpuInfo

__all__ = ["Slot", "SlotPool", "resolve_gpus", "threads_per_trial"]


@dataclass(frozen=True)
class Slot:
    id: int
    gpu: GpuInfo | None  # None: a CPU slot

    @property
    def cuda_visible_devices(self) -> str:
        """What the child's CUDA_VISIBLE_DEVICES is set to: the NVML index (the child also
        gets CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers GPUs as NVML does), or empty."""
        return str(self.gpu.index) if self.gpu is not None else ""

    @property
    def label(self) -> str:
        return f"gpu{self.gpu.index}" if self.gpu is not None else f"cpu{self.id}"


def resolve_gpus(wanted: Any, backend: GpuBackend) -> list[GpuInfo]:
    """The GPUs to schedule on, from ``scheduler.gpus`` (auto, none, or NVML indices)."""
    found = backend.gpus()
    if wanted == "none":
        return []
    if wanted == "auto":
        return found
    by_index = {gpu.index: gpu for gpu in found}
    for index in wanted:
        if index not in by_index:
            have = ", ".join(str(i) for i in by_index) or "none"
            reason = f" ({backend.unavailable_reason})" if backend.unavailable_reason else ""
            raise ConfigError(f"scheduler.gpus: GPU {index} does not exist on this host{reason}",
                              f"GPUs found: {have}; use scheduler.gpus=auto or a subset")
    return [by_index[i] for i in dict.fromkeys(wanted)]


def threads_per_trial(configured: int | None, concurrency: int) -> int:
    """CPU threads one trial may use so that ``concurrency`` trials do not oversubscribe."""
    if configured is not None:
        return configured
    cores = len(os.sched_getaffinity(0))
    return max(1, cores // concurrency)


class SlotPool:
    """Free and busy slots of this orchestrator.

    Not thread safe: only the orchestrator's loop uses it. A trial holds its slot from spawn
    until its process has exited and its result is written.
    """

    def __init__(self, gpus: list[GpuInfo], parallel: int, trials_per_gpu: int | None) -> None:
        if gpus:
            per_gpu = trials_per_gpu or math.ceil(parallel / len(gpus))
            self.slots = [Slot(id=i, gpu=gpu) for i, gpu in
                          enumerate(gpu for _ in range(per_gpu) for gpu in gpus)]
        else:
            self.slots = [Slot(id=i, gpu=None) for i in range(parallel)]
        self.concurrency = min(parallel, len(self.slots))
        self._busy: set[int] = set()

    def has_free(self) -> bool:
        return len(self._busy) < self.concurrency

    def acquire(self, free_mib: dict[int, float] | None = None) -> Slot | None:
        """A free slot on the least-loaded GPU (lowest index first), or None when full.

        With ``free_mib`` (GPU index -> free memory), the GPU with the most free memory wins
        first: that is where a trial that ran out of memory is retried.
        """
        if len(self._busy) >= self.concurrency:
            return None
        load: dict[int | None, int] = {}
        for slot in self.slots:
            if slot.id in self._busy:
                key = slot.gpu.index if slot.gpu else None
                load[key] = load.get(key, 0) + 1
        free = [s for s in self.slots if s.id not in self._busy]
        if not free:
            return None
        def rank(s: Slot) -> tuple[float, int, int]:
            index = s.gpu.index if s.gpu else None
            memory = -free_mib.get(index, 0.0) if free_mib and index is not None else 0.0
            return memory, load.get(index, 0), s.id

        slot = min(free, key=rank)
        self._busy.add(slot.id)
        return slot

    def release(self, slot: Slot) -> None:
        self._busy.discard(slot.id)

    @property
    def busy(self) -> int:
        return len(self._busy)
