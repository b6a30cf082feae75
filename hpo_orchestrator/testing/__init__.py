"""Fakes shipped with the package so that tests (ours and users') run without GPUs."""

from __future__ import annotations

from hpo_orchestrator.testing.fake_gpu import FakeGpuBackend

__all__ = ["FakeGpuBackend"]
