"""The study as a run sees it: its set-up from the config, and the run's Optuna storage.

Modules by concern:

- ``_setup``: sampler, pruner and study from the validated config, the config recorded on
  the study (a resumed run is checked against it), and ``study.enqueue`` at a run's start;
- ``_storage``: ``MirrorStorage``, the run's Optuna storage: reads from an in-memory mirror
  of the study (``_mirror``: its trials and the bulk reads that fill it), writes through
  ``RDBStorage`` (docs/DESIGN.md §3.2);
- ``_lost``: a sqlite file deleted or truncated under a run, and what the run held saved;
- ``_end``: a trial's end as a value (``TrialEnd``), written in the transaction of its tell,
  and a running trial's reports written in batches.
"""

from __future__ import annotations

from hpo_orchestrator.study._end import Requeue, TrialEnd
from hpo_orchestrator.study._lost import (
    DELETED,
    REPLACED,
    SqliteWatch,
    StorageLost,
    finished_in,
    save_held,
    save_trials,
)
from hpo_orchestrator.study._setup import (
    build_sampler,
    create_or_load_study,
    enqueue_configured,
    objective_differences,
    record_config,
    trials_space,
    without_pruning,
)
from hpo_orchestrator.study._space import StudySpace, read_study_space
from hpo_orchestrator.study._storage import MirrorStorage

__all__ = [
    "DELETED",
    "REPLACED",
    "MirrorStorage",
    "Requeue",
    "SqliteWatch",
    "StorageLost",
    "StudySpace",
    "TrialEnd",
    "build_sampler",
    "create_or_load_study",
    "enqueue_configured",
    "finished_in",
    "objective_differences",
    "read_study_space",
    "record_config",
    "save_held",
    "save_trials",
    "trials_space",
    "without_pruning",
]
