"""The backend of a machine without usable GPUs: the scheduler falls back to CPU slots."""

from __future__ import annotations

from hpo_orchestrator.gpu._base import GpuInfo, GpuSample

__all__ = ["NoGpuBackend"]


class NoGpuBackend:
    name = "none"

    def __init__(self, reason: str) -> None:
        self.unavailable_reason: str | None = reason

    def gpus(self) -> list[GpuInfo]:
        return []

    def fastest_first(self) -> list[GpuInfo] | None:
        return []

    def sample(self, index: int) -> GpuSample | None:
        return None

    def close(self) -> None:
        pass
