"""The scripted GPU backend for tests, where tests and users have always found it; it lives in
gpu/_fake.py beside the backends it imitates (hpo_orchestrator.gpu exports it)."""

from __future__ import annotations

from hpo_orchestrator.gpu import (
    FAKE_FOREIGN_ENV,
    FAKE_MACHINE_ENV,
    FAKE_WORK_DIR_ENV,
    FakeGpu,
    FakeGpuBackend,
    fake_uuid,
)

__all__ = ["FAKE_FOREIGN_ENV", "FAKE_MACHINE_ENV", "FAKE_WORK_DIR_ENV", "FakeGpu", "FakeGpuBackend",
           "fake_uuid"]
