"""GPU inventory: one protocol, backends for NVML, no GPU, and a scripted fake for tests."""

from __future__ import annotations

import os

from hpo_orchestrator.gpu._allocation import AllocatedBackend, allocate
from hpo_orchestrator.gpu._base import GpuBackend, GpuInfo, GpuSample
from hpo_orchestrator.gpu._none import NoGpuBackend
from hpo_orchestrator.gpu._nvml import NvmlBackend

__all__ = [
    "FAKE_GPUS_ENV",
    "AllocatedBackend",
    "GpuBackend",
    "GpuInfo",
    "GpuSample",
    "NoGpuBackend",
    "NvmlBackend",
    "allocate",
    "open_backend",
]

# Tests (and demos on CPU machines) set this to a fake GPU spec; see hpo_orchestrator.testing.
FAKE_GPUS_ENV = "HPO_ORCHESTRATOR_FAKE_GPUS"


def open_backend() -> AllocatedBackend:
    """The fake backend if $HPO_ORCHESTRATOR_FAKE_GPUS is set, else NVML, else none; limited
    to this process's allocation (an inherited CUDA_VISIBLE_DEVICES, see _allocation.py).

    Raises ConfigError when CUDA_VISIBLE_DEVICES names a GPU this host does not have.
    """
    return allocate(_open_host_backend(), os.environ)


def _open_host_backend() -> GpuBackend:
    fake_spec = os.environ.get(FAKE_GPUS_ENV)
    if fake_spec:
        # The one place production code reaches into testing/, and only when the user asks.
        from hpo_orchestrator.testing.fake_gpu import FakeGpuBackend

        return FakeGpuBackend.from_spec(fake_spec)
    opened = NvmlBackend.open()
    if isinstance(opened, str):
        return NoGpuBackend(opened)
    return opened
