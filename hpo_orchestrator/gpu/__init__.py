"""GPU inventory: one protocol, backends for NVML, no GPU, and a scripted fake for tests."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hpo_orchestrator.gpu._allocation import AllocatedBackend, allocate
from hpo_orchestrator.gpu._base import GpuBackend, GpuInfo, GpuSample
from hpo_orchestrator.gpu._none import NoGpuBackend
from hpo_orchestrator.gpu._nvml import NvmlBackend
from hpo_orchestrator.gpu._opencl import choose_lightgbm_device, list_platforms, nvidia_icd_env

if TYPE_CHECKING:
    from hpo_orchestrator.gpu._fake import (
        FAKE_FOREIGN_ENV,
        FAKE_MACHINE_ENV,
        FAKE_WORK_DIR_ENV,
        FakeGpu,
        FakeGpuBackend,
        fake_uuid,
    )

__all__ = [
    "FAKE_FOREIGN_ENV",
    "FAKE_GPUS_ENV",
    "FAKE_MACHINE_ENV",
    "FAKE_WORK_DIR_ENV",
    "AllocatedBackend",
    "FakeGpu",
    "FakeGpuBackend",
    "GpuBackend",
    "GpuInfo",
    "GpuSample",
    "NoGpuBackend",
    "NvmlBackend",
    "allocate",
    "choose_lightgbm_device",
    "fake_uuid",
    "list_platforms",
    "nvidia_icd_env",
    "open_backend",
]

# Tests (and demos on CPU machines) set this to a fake GPU spec; see gpu/_fake.py.
FAKE_GPUS_ENV = "HPO_ORCHESTRATOR_FAKE_GPUS"
_FAKE_NAMES = ("FAKE_FOREIGN_ENV", "FAKE_MACHINE_ENV", "FAKE_WORK_DIR_ENV", "FakeGpu", "FakeGpuBackend",
               "fake_uuid")


def __getattr__(name: str) -> Any:
    """The scripted fake is loaded only when something asks for it: a run only when
    $HPO_ORCHESTRATOR_FAKE_GPUS is set (tests/repo/test_imports.py checks it)."""
    if name in _FAKE_NAMES:
        from hpo_orchestrator.gpu import _fake

        return getattr(_fake, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_backend() -> AllocatedBackend:
    """The fake backend if $HPO_ORCHESTRATOR_FAKE_GPUS is set, else NVML, else none; limited
    to this process's allocation (an inherited CUDA_VISIBLE_DEVICES, see _allocation.py).

    Raises ConfigError when CUDA_VISIBLE_DEVICES names a GPU this host does not have.
    """
    return allocate(_open_host_backend(), os.environ)


def _open_host_backend() -> GpuBackend:
    fake_spec = os.environ.get(FAKE_GPUS_ENV)
    if fake_spec:
        # The one place a run loads the fake, and only when the user asks.
        from hpo_orchestrator.gpu._fake import FakeGpuBackend

        return FakeGpuBackend.from_spec(fake_spec)
    opened = NvmlBackend.open()
    if isinstance(opened, str):
        return NoGpuBackend(opened)
    return opened
