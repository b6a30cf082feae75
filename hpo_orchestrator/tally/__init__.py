"""A study's tally (``hpo_study_tally``): what ``status`` shows, summed over the finished trials
and kept as one row, and the reads status makes of the summary table beside it.

Its own room, below both of its sides: the run's write path folds each trial's end into it
(study/_end.py, scheduler/_writes.py) and status reads it (status/_collect.py); neither
imports the other.
"""

from __future__ import annotations

from hpo_orchestrator.tally._tally import (
    VERSION,
    DeviceTally,
    SinceTrial,
    Tally,
    fail_attrs,
    failed_upto,
    flags_upto,
    has_tally_table,
    ordered_window,
    other_studies_busy,
    read_tally,
    trials_since,
    trusted,
)
from hpo_orchestrator.tally._tally import advance as advance_tally

__all__ = ["VERSION", "DeviceTally", "SinceTrial", "Tally", "advance_tally", "fail_attrs",
           "failed_upto", "flags_upto", "has_tally_table", "ordered_window", "other_studies_busy",
           "read_tally", "trials_since", "trusted"]
