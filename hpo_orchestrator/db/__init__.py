"""The database's shared layer: the statement runner, and the queries several features share.

Each feature keeps its own statements beside its rules (the budget in scheduler/_budget.py, the
mirror and a trial's end in study/, the tally in tally/_tally.py, retention in telemetry/,
artifacts in artifacts/_fetch.py); this package holds what they all stand on and what several
of them read. Every statement is a module-level ``_..._SQL`` constant, wherever it lives, so
tests/db/test_db_contract.py runs each one against a database made by the installed Optuna.

This face imports no SQLAlchemy: ``status --json`` on a sqlite file reads through ``sqlite3``
alone (db/_sql.py), where SQLAlchemy's import would cost more than the read. What is
SQLAlchemy's own lives in two public modules that callers import by name:
``hpo_orchestrator.db.connect`` (URLs, engines, Optuna's RDBStorage, the locks between
orchestrators) and ``hpo_orchestrator.db.tables`` (our tables, made, extended and written).

Modules by concern:

- ``_sql``: running a statement on a SQLAlchemy connection or a plain ``sqlite3`` one;
- ``_version``: the Optuna schema revision a database must have, checked at open;
- ``_sqlite``: a plain sqlite study opened read-only with ``sqlite3`` alone (``status --json``);
- ``_summary``: ``SummaryRow``, the summary row's one definition (columns, the attrs each
  copies);
- ``_study``: study lookup, direction, our study attrs, read errors;
- ``_trials``: one narrow row per trial, counts, best trial, heartbeats (status, report);
- ``_best``: directions, the best trial or Pareto front, a trial's params (``best``);
- ``_detail``: one trial in full, the failures' errors, the most recently run study;
- ``_curves``: learning curves and step timings (tune-pruner, min_resource=auto);
- ``_telemetry``: reads of the samples (report, telemetry export);
- ``_run``: what the orchestrator reads and writes beside Optuna's storage API during a run
  (the study's storage and the scheduler both write through it);
- ``_retry``: storage trouble during a run: its cause, retries for ``storage.retry_s``.

Readers take a SQLAlchemy ``Connection`` or a ``sqlite3`` one and return plain Python values
(states as 'COMPLETE', timestamps as naive UTC datetimes) whatever the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator.db._best import (
    ScoredTrial,
    best_trials,
    pareto_front,
    study_directions,
    study_space,
    trial_params,
)
from hpo_orchestrator.db._curves import (
    CurveTrial,
    first_of_last,
    intermediate_values,
    step_timings,
    trials_with_values,
    worker_firsts,
)
from hpo_orchestrator.db._detail import fail_errors, latest_study, trial_detail
from hpo_orchestrator.db._retry import (
    Retrying,
    StorageUnavailable,
    first_line,
    is_retried,
    retried,
    retrying_of,
    trouble_of,
)
from hpo_orchestrator.db._run_io import (
    RunningTrialRow,
    ask_running_trial,
    attempt_of,
    create_running_trial,
    enqueue_waiting_trial,
    fail_running_trial,
    max_completed_step,
    no_longer_running,
    record_heartbeat,
    requeue_unstarted_trial,
    running_among,
    start_running_trial,
    write_trial_attrs,
)
from hpo_orchestrator.db._sql import dialect, execute_many, fetch_all, fetch_one, has_table, rows, scalar
from hpo_orchestrator.db._sqlite import open_sqlite
from hpo_orchestrator.db._study import (
    UNREADABLE,
    database_now,
    list_studies,
    read_errors,
    state_name,
    study_attrs,
    study_config,
    study_id_of,
    to_datetime,
    to_epoch,
    to_epochs,
)
from hpo_orchestrator.db._summary import FLAGGED_WHERE, SUMMARY_COLUMNS, SummaryRow
from hpo_orchestrator.db._telemetry import (
    TELEMETRY_COLUMNS,
    Sample,
    has_telemetry_table,
    has_trial,
    telemetry_rows,
    telemetry_samples,
)
from hpo_orchestrator.db._trial_rows import (
    ATTR_KEYS,
    SummaryFlags,
    TrialRow,
    UncoveredTrial,
    best_of,
    best_trial,
    from_attrs,
    has_summary_table,
    heartbeat_of,
    state_counts,
    summary_flags,
    summary_max_complete_step,
    summary_prune_steps,
    summary_rows,
    trial_rows,
    trial_values,
    uncovered_trials,
)
from hpo_orchestrator.db._version import SCHEMA_REVISION, check_schema

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable as Readable  # a type only: not in __all__

__all__ = [
    "ATTR_KEYS", "FLAGGED_WHERE", "SCHEMA_REVISION", "SUMMARY_COLUMNS", "TELEMETRY_COLUMNS",
    "UNREADABLE", "CurveTrial", "Retrying", "RunningTrialRow", "Sample", "ScoredTrial",
    "StorageUnavailable", "SummaryFlags", "SummaryRow", "TrialRow", "UncoveredTrial",
    "ask_running_trial", "attempt_of", "best_of", "best_trial", "best_trials", "check_schema",
    "create_running_trial", "database_now", "dialect", "enqueue_waiting_trial",
    "execute_many", "fail_errors", "fail_running_trial", "fetch_all", "fetch_one", "first_line",
    "first_of_last", "from_attrs", "has_summary_table", "has_table", "has_telemetry_table",
    "has_trial", "heartbeat_of", "intermediate_values", "is_retried", "latest_study",
    "list_studies", "max_completed_step", "no_longer_running", "open_sqlite", "pareto_front",
    "read_errors", "record_heartbeat", "requeue_unstarted_trial", "retried", "retrying_of",
    "rows", "running_among", "scalar",
    "start_running_trial", "state_counts", "state_name", "step_timings", "study_attrs",
    "study_config", "study_directions", "study_id_of", "study_space", "summary_flags",
    "summary_max_complete_step", "summary_prune_steps", "summary_rows", "telemetry_rows",
    "telemetry_samples", "to_datetime", "to_epoch", "to_epochs", "trial_detail", "trial_params", "trial_rows",
    "trial_values", "trials_with_values", "trouble_of", "uncovered_trials", "worker_firsts",
    "write_trial_attrs",
]
