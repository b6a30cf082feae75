"""NVML through nvidia-ml-py; every call goes through :func:`nvml_query`."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hpo_orchestrator.gpu._base import GpuInfo, GpuSample

__all__ = ["NvmlBackend"]

T = TypeVar("T")
_MIB = 1024 * 1024
# nvmlDeviceGetProcessUtilization is slow on some drivers (tens of ms per call): it
# is called at most as often as keeps its measured cost under this share of one core; at the
# ~1 ms it takes on an H200 with driver 580 that is every sample.
_PROC_UTIL_SHARE = 0.005
_CANNOT_START = "NVML could not start ({}); no NVIDIA driver on this machine?"


def nvml_query(func: Callable[..., T], *args: Any, default: T | None = None) -> T | None:
    """Call one NVML function; an unsupported or failed metric becomes ``default``.

    Degrading per metric keeps one unreadable counter (power on some boards, per-process
    utilization on older drivers) from hiding all the others.
    """
    import pynvml

    try:
        return func(*args)
    except pynvml.NVMLError:
        return default


def _driver_library_loads() -> bool:
    """Does the NVIDIA driver's NVML library load? On Linux nvidia-ml-py loads exactly
    libnvidia-ml.so.1 and fails without it; elsewhere it is left to nvidia-ml-py."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _text(value: str | bytes) -> str:
    """nvidia-ml-py returns bytes from some versions' structs and str from others."""
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend:
    """GPUs read through NVML. Construct with :meth:`open`, which never raises."""

    name = "nvml"

    def __init__(self, gpus: list[GpuInfo], handles: dict[int, Any]) -> None:
        self._gpus = gpus
        self._handles = handles
        self._lock = threading.Lock()
        # NVML's per-process utilization returns samples newer than a timestamp (µs); asking
        # from the last sample we saw gives each process's recent SM share.
        self._last_process_sample_us: dict[int, int] = {}
        self._proc_util_next: dict[int, float] = {}  # GPU index -> time.monotonic() of next call
        self.proc_util_cost_s: float | None = None  # the call's last measured duration
        self.unavailable_reason: str | None = None if gpus else "NVML lists no GPU"

    @classmethod
    def open(cls) -> NvmlBackend | str:
        """The backend, or the reason NVML cannot be used on this machine."""
        if importlib.util.find_spec("pynvml") is None:
            return "nvidia-ml-py (module pynvml) is not installed"
        if not _driver_library_loads():
            # what nvmlInit would say, without importing pynvml (30 ms on a 2-core machine,
            # a run's start-up on every host without a GPU)
            return _CANNOT_START.format("NVML Shared Library Not Found")
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return _CANNOT_START.format(exc)
        handles: dict[int, Any] = {}
        gpus: list[GpuInfo] = []
        count = nvml_query(pynvml.nvmlDeviceGetCount, default=0) or 0
        for index in range(count):
            handle = nvml_query(pynvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue  # a lost card: the others keep working
            memory = nvml_query(pynvml.nvmlDeviceGetMemoryInfo, handle)
            pci = nvml_query(pynvml.nvmlDeviceGetPciInfo, handle)
            handles[index] = handle
            gpus.append(GpuInfo(
                index=index,
                uuid=str(nvml_query(pynvml.nvmlDeviceGetUUID, handle, default=f"GPU-{index}")),
                name=str(nvml_query(pynvml.nvmlDeviceGetName, handle, default="NVIDIA GPU")),
                memory_total_mib=memory.total / _MIB if memory is not None else None,
                pci_bus_id=_text(pci.busId) if pci is not None else None,
            ))
        return cls(gpus, handles)

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def fastest_first(self) -> list[GpuInfo] | None:
        """CUDA ranks GPUs by speed and breaks ties by PCI bus id: on a host of one model that
        is PCI order; on a mixed host the ranking is CUDA's own, so None."""
        if len({g.name for g in self._gpus}) > 1:
            return None
        return sorted(self._gpus, key=lambda g: (g.pci_bus_id or "", g.index))

    def sample(self, index: int) -> GpuSample | None:
        import pynvml

        handle = self._handles.get(index)
        if handle is None:
            return None
        with self._lock:
            util = nvml_query(pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = nvml_query(pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = nvml_query(pynvml.nvmlDeviceGetPowerUsage, handle)
            temp = nvml_query(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            procs: list[Any] = nvml_query(pynvml.nvmlDeviceGetComputeRunningProcesses, handle,
                                          default=[]) or []
            since = self._last_process_sample_us.get(index, 0)
            proc_util: list[Any] = []
            started = time.monotonic()
            if started >= self._proc_util_next.get(index, 0.0):
                # Raises NOT_FOUND while no process has run recently: that means "no samples".
                proc_util = nvml_query(pynvml.nvmlDeviceGetProcessUtilization, handle,
                                       since, default=[]) or []
                cost = time.monotonic() - started
                self.proc_util_cost_s = cost
                self._proc_util_next[index] = started + cost / _PROC_UTIL_SHARE
        sm_by_pid: dict[int, float] = {}
        for entry in proc_util:
            sm_by_pid[entry.pid] = max(sm_by_pid.get(entry.pid, 0.0), float(entry.smUtil))
            self._last_process_sample_us[index] = max(since, int(entry.timeStamp))
        processes: dict[int, tuple[float | None, float | None]] = {
            p.pid: (sm_by_pid.get(p.pid), (p.usedGpuMemory / _MIB) if p.usedGpuMemory else None)
            for p in procs
        }
        return GpuSample(
            index=index,
            sm_util=float(util.gpu) if util is not None else None,
            mem_used_mib=memory.used / _MIB if memory is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            processes=processes,
        )

    def close(self) -> None:
        import pynvml

        nvml_query(pynvml.nvmlShutdown)
