"""Which RUNNING trials no orchestrator asked: a rule of the rows alone, without SQLAlchemy
(status reads a kept tally without importing it: docs/BENCHMARKS.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpo_orchestrator import keys

__all__ = ["asked_outside"]


def asked_outside(attrs: Mapping[str, Any], beats: bool) -> bool:
    """A RUNNING trial that no orchestrator asked (``optuna ask``, a plain ``study.optimize``
    beside the run): none of the attrs an orchestrator writes with the trial's row (or, for
    a retry it enqueued, before) and no heartbeat. Its maker finishes it, not a run: reaping
    leaves it alone and the budget does not wait for it; status shows it as ``outside``."""
    return not beats and all(attrs.get(key) is None for key in (
        keys.HOST, keys.PID, keys.ORCHESTRATOR_PID, keys.RETRY_OF))
