"""hpo-orchestrator: Optuna HPO that keeps every GPU of a machine busy with trials.

Objectives use :func:`phase`, :func:`slot_info` and :func:`save_artifact`; a run is started by the
``hpo-orchestrator`` command, or in-process by :func:`run_study`. Each is imported on first use:
``run_study`` brings Optuna and the scheduler, which an objective's process does not need, and
the objectives' API the trial machinery, which ``status`` and the other commands do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpo_orchestrator.artifacts import save_artifact
    from hpo_orchestrator.runner import RunResult, run_study
    from hpo_orchestrator.worker import SlotInfo, phase, slot_info

__all__ = ["RunResult", "SlotInfo", "__version__", "phase", "run_study", "save_artifact", "slot_info"]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("SlotInfo", "phase", "slot_info"):  # objectives' API: the commands need none
        from hpo_orchestrator import worker

        return getattr(worker, name)
    if name in ("RunResult", "run_study"):
        from hpo_orchestrator import runner

        return getattr(runner, name)
    if name == "save_artifact":  # keeping the trial's files: loaded by objectives that do
        from hpo_orchestrator.artifacts import save_artifact

        return save_artifact
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
