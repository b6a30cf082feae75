"""``hpo-orchestrator status``: what the study did, from SQL over the storage."""

from __future__ import annotations

from hpo_orchestrator.db import list_studies
from hpo_orchestrator.status._collect import (
    collect_status,
    collect_status_sqlite,
    collect_with_rows,
    device_label,
)
from hpo_orchestrator.status._model import DeviceUse, Finding, StateStats, StatusReport, StudyFacts
from hpo_orchestrator.status._packing import device_choice_line, packing_lines
from hpo_orchestrator.status._render import print_status, render_status
from hpo_orchestrator.status._tally import advance as advance_tally
from hpo_orchestrator.status._tuning import pruner_tuning_lines

__all__ = ["DeviceUse", "Finding", "StateStats", "StatusReport", "StudyFacts", "advance_tally",
           "collect_status", "collect_status_sqlite", "collect_with_rows", "device_choice_line",
           "device_label", "list_studies", "packing_lines", "print_status", "pruner_tuning_lines",
           "render_status"]
