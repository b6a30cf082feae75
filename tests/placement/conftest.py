"""Fixtures shared by the packer's tests."""

from __future__ import annotations

import pytest

from tests.placement.test_packer import _Clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """The packer's clock, moved by the test (``clock.now``), not by time passing."""
    from hpo_orchestrator.placement import _packer

    fake = _Clock()
    monkeypatch.setattr(_packer, "time", fake)
    return fake
