"""hpo-orchestrator: Optuna HPO that keeps every GPU of a machine busy with trials.

Objectives use :func:`phase` and :func:`slot_info`; a run is started by the
``hpo-orchestrator`` command, or in-process by :func:`run_study` (imported on first use: it
brings Optuna and the scheduler, which an objective's process does not need).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpo_orchestrator.runtime import SlotInfo, phase, slot_info

if TYPE_CHECKING:
    from hpo_orchestrator.runner import RunResult, run_study

__all__ = ["RunResult", "SlotInfo", "__version__", "phase", "run_study", "slot_info"]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("RunResult", "run_study"):
        from hpo_orchestrator import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
