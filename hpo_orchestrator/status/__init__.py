"""``hpo-orchestrator status``: what the study did, from SQL over the storage."""

from __future__ import annotations

from hpo_orchestrator.status._queries import StateStats, StatusReport, collect_status, list_studies
from hpo_orchestrator.status._render import print_status, render_status

__all__ = ["StateStats", "StatusReport", "collect_status", "list_studies", "print_status",
           "render_status"]
