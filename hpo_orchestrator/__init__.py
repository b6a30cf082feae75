"""hpo-orchestrator: Optuna HPO that keeps every GPU of a machine busy with trials.

Objectives use :func:`phase` and :func:`slot_info`; everything else is driven by the
``hpo-orchestrator`` command.
"""

from __future__ import annotations

from hpo_orchestrator.runtime import SlotInfo, phase, slot_info

__all__ = ["SlotInfo", "__version__", "phase", "slot_info"]

__version__ = "0.1.0"
