"""The GPU backend protocol shared by the NVML, none and fake implementations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["GpuBackend", "GpuInfo", "GpuSample"]


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as NVML numbers it (PCI bus order, the order CUDA_DEVICE_ORDER=PCI_BUS_ID uses)."""

    index: int
    uuid: str
    name: str
    memory_total_mib: float | None = None
    pci_bus_id: str | None = None  # e.g. 00000000:1B:00.0; the order of CUDA_DEVICE_ORDER=PCI_BUS_ID


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. Any metric the driver will not give is ``None``."""

    index: int
    sm_util: float | None
    mem_used_mib: float | None
    power_w: float | None
    temp_c: float | None
    # pid -> (SM utilization %, memory MiB) for the processes the driver lists on this GPU.
    processes: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)


class GpuBackend(Protocol):
    """What the scheduler and the telemetry sampler need from the GPUs of this host.

    Thread safety: ``sample`` is called from the telemetry thread while the scheduler calls
    ``gpus``; implementations must allow that. ``gpus`` is stable for the backend's lifetime.
    ``unavailable_reason`` says once, for the user, why no GPU was found (None when fine).
    ``fastest_first`` is CUDA's default numbering (CUDA_DEVICE_ORDER=FASTEST_FIRST) of
    ``gpus()``, or None where only CUDA itself could tell (a host of different GPUs).
    """

    name: str
    unavailable_reason: str | None

    def gpus(self) -> list[GpuInfo]: ...

    def fastest_first(self) -> list[GpuInfo] | None: ...

    def sample(self, index: int) -> GpuSample | None: ...

    def close(self) -> None: ...
