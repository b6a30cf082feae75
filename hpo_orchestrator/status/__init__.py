"""``hpo-orchestrator status``: what the study did, from SQL over the storage, folded into the
study's tally (tally/: a run keeps it at each trial's end, ``advance_tally``)."""

from __future__ import annotations

from hpo_orchestrator.status._collect import collect, collect_status, collect_status_sqlite, device_label
from hpo_orchestrator.status._model import DeviceUse, Finding, StateStats, StatusReport, StudyFacts
from hpo_orchestrator.status._output import print_status, render_status
from hpo_orchestrator.status._packing_lines import device_choice_line, packing_lines
from hpo_orchestrator.status._tuning import pruner_tuning_lines

__all__ = ["DeviceUse", "Finding", "StateStats", "StatusReport", "StudyFacts", "collect", "collect_status",
           "collect_status_sqlite", "device_choice_line", "device_label", "packing_lines", "print_status",
           "pruner_tuning_lines", "render_status"]
