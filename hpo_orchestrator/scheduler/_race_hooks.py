"""Test-only hooks in the budget's code path, no-ops unless a test sets their variable
(here, not in testing/, which production code never imports).

``HPO_TEST_BUDGET_RACE=<folder>:<parties>:<window_s>`` makes a budget race certain instead of
lucky. Each orchestrator, at its first claim, waits until ``parties`` orchestrators have
reached their first claim (so none is still starting up); then, between its count and its
ask, it waits until every party has counted too, or ``window_s`` passed. Without the study's
lock all parties count the same number and all ask; with it, the others wait on the lock, the
window runs out, and the counts stay exact.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["BUDGET_RACE_ENV", "budget_claim_started", "budget_counted"]

BUDGET_RACE_ENV = "HPO_TEST_BUDGET_RACE"
_POLL_S = 0.01
_GATE_TIMEOUT_S = 120.0  # a party that never starts must not hang the test forever


def _race() -> tuple[Path, int, float] | None:
    spec = os.environ.get(BUDGET_RACE_ENV)
    if not spec:
        return None
    folder, parties, window_s = spec.rsplit(":", 2)
    return Path(folder), int(parties), float(window_s)


def _meet(folder: Path, kind: str, parties: int, timeout_s: float) -> None:
    (folder / f"{kind}-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(folder.glob(f"{kind}-*"))) < parties and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def budget_claim_started() -> None:
    """Before the study's lock: the first claim of each party waits for the others."""
    race = _race()
    if race is not None and not (race[0] / f"started-{os.getpid()}").exists():
        _meet(race[0], "started", race[1], _GATE_TIMEOUT_S)


def budget_counted() -> None:
    """Between the count and the ask: wait for the other parties to have counted."""
    race = _race()
    if race is not None:
        _meet(race[0], "counted", race[1], race[2])
