"""The database's shared layer: connections, and the queries several features share.

Each feature keeps its own statements beside its rules (the budget in scheduler/_budget.py, the
mirror and a trial's end in study/, the tally in status/_tally.py, retention in telemetry/,
artifacts in artifacts/_fetch.py); this package holds what they all stand on and what
several of them read. Every statement is a module-level ``_..._SQL`` constant, wherever it
lives, so tests/test_db_contract.py runs each one against a database made by the installed
Optuna. Modules by concern:

- ``_engine``: URLs, engines (sqlite tuned for a long run), the locks between orchestrators;
- ``_version``: the Optuna schema revision a database must have, checked at open;
- ``_sql``: running a statement on a SQLAlchemy connection or a plain ``sqlite3`` one;
- ``_sqlite``: a plain sqlite study opened read-only with ``sqlite3`` alone (``status --json``);
- ``_schema``: our own tables (``hpo_telemetry``, ``hpo_trial_summary``, ``hpo_study_tally``),
  and the summary's columns that a table of an older version lacks, added at a run's start;
- ``_summary``: ``SummaryRow``, the summary row's one definition (columns, the attrs each
  copies);
- ``_study``: study lookup, direction, our study attrs, read errors;
- ``_trials``: one narrow row per trial, counts, best trial, heartbeats (status, report);
- ``_curves``: learning curves and step timings (tune-pruner, min_resource=auto);
- ``_telemetry``: reads of the samples (report, telemetry export);
- ``_run``: what the orchestrator reads and writes beside Optuna's storage API during a run;
- ``_retry``: storage trouble during a run: its cause, retries for ``storage.retry_s``;
- ``_best``: directions, the best trial or Pareto front, a trial's params (``best``);
- ``_detail``: one trial in full, the failures' errors, the most recently run study.

Readers take a SQLAlchemy ``Connection`` and return plain Python values (states as
'COMPLETE', timestamps as naive UTC datetimes) whatever the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator._lazy import lazy_getattr

# Each name is imported from its module on first use (PEP 562), so that a command imports only
# what it reads with: ``status --json`` on sqlite reads through sqlite3 and never imports
# SQLAlchemy (db/_sql.py); type checkers see the plain imports.
if TYPE_CHECKING:
    from hpo_orchestrator.db._best import (
        ScoredTrial,
        best_trials,
        pareto_front,
        study_directions,
        trial_params,
    )
    from hpo_orchestrator.db._curves import (
        CurveTrial,
        first_of_last,
        intermediate_values,
        step_timings,
        trials_with_values,
    )
    from hpo_orchestrator.db._detail import count_retried, fail_errors, latest_study, trial_detail
    from hpo_orchestrator.db._engine import (
        ADVISORY_NAMESPACE,
        check_url,
        create_engine,
        file_lock,
        lock_file,
        mask_url,
        mask_url_in,
        open_rdb_storage,
        paste_url,
        setup_lock,
        sqlite_path,
        validated_path,
    )
    from hpo_orchestrator.db._retry import (
        Retrying,
        StorageUnavailable,
        first_line,
        is_retried,
        retried,
        retrying_of,
        trouble_of,
    )
    from hpo_orchestrator.db._run import (
        RunningTrialRow,
        ask_running_trial,
        attempt_of,
        create_running_trial,
        enqueue_waiting_trial,
        fail_running_trial,
        max_completed_step,
        no_longer_running,
        running_among,
        start_running_trial,
        write_trial_attrs,
    )
    from hpo_orchestrator.db._schema import (
        TELEMETRY_COLUMNS,
        add_summary_columns,
        ensure_tables,
        insert_samples,
        insert_summary,
        summary_table,
        tally_table,
        telemetry_table,
    )
    from hpo_orchestrator.db._sql import Readable as Readable  # a type only: not in __all__
    from hpo_orchestrator.db._sql import dialect, fetch_all, fetch_one, has_table, rows, scalar
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
    )
    from hpo_orchestrator.db._summary import FLAGGED_WHERE, SUMMARY_COLUMNS, SummaryRow
    from hpo_orchestrator.db._telemetry import (
        Sample,
        has_telemetry_table,
        has_trial,
        telemetry_rows,
        telemetry_samples,
    )
    from hpo_orchestrator.db._trials import (
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

_MODULES = {
    "open_sqlite": "_sqlite",
    **dict.fromkeys(["dialect", "fetch_all", "fetch_one", "has_table", "rows", "scalar"], "_sql"),
    **dict.fromkeys(["ScoredTrial", "best_trials", "pareto_front", "study_directions",
                     "trial_params"], "_best"),
    **dict.fromkeys(["CurveTrial", "first_of_last", "intermediate_values", "step_timings",
                     "trials_with_values"], "_curves"),
    **dict.fromkeys(["count_retried", "fail_errors", "latest_study", "trial_detail"], "_detail"),
    **dict.fromkeys(["ADVISORY_NAMESPACE", "check_url", "create_engine", "file_lock", "lock_file",
                     "mask_url", "mask_url_in", "open_rdb_storage", "paste_url", "setup_lock",
                     "sqlite_path", "validated_path"], "_engine"),
    **dict.fromkeys(["Retrying", "StorageUnavailable", "first_line", "is_retried", "retried",
                     "retrying_of", "trouble_of"], "_retry"),
    **dict.fromkeys(["RunningTrialRow", "ask_running_trial", "attempt_of", "create_running_trial",
                     "enqueue_waiting_trial",
                     "fail_running_trial", "max_completed_step", "no_longer_running", "running_among",
                     "start_running_trial", "write_trial_attrs"], "_run"),
    **dict.fromkeys(["TELEMETRY_COLUMNS", "add_summary_columns", "ensure_tables", "insert_samples",
                     "insert_summary", "summary_table", "tally_table", "telemetry_table"], "_schema"),
    **dict.fromkeys(["FLAGGED_WHERE", "SUMMARY_COLUMNS", "SummaryRow"], "_summary"),
    **dict.fromkeys(["UNREADABLE", "database_now", "list_studies", "read_errors", "state_name",
                     "study_attrs", "study_config", "study_id_of", "to_datetime"], "_study"),
    **dict.fromkeys(["Sample", "has_telemetry_table", "has_trial", "telemetry_rows",
                     "telemetry_samples"], "_telemetry"),
    **dict.fromkeys(["ATTR_KEYS", "SummaryFlags", "TrialRow", "UncoveredTrial", "best_of", "best_trial",
                     "from_attrs", "has_summary_table", "heartbeat_of", "state_counts", "summary_flags",
                     "summary_max_complete_step", "summary_prune_steps", "summary_rows", "trial_rows",
                     "trial_values", "uncovered_trials"], "_trials"),
    **dict.fromkeys(["SCHEMA_REVISION", "check_schema"], "_version"),
}


__getattr__ = lazy_getattr(__name__, _MODULES, globals())
# Every name of the table; the imports above name the same for type checkers
# (tests/test_imports.py checks that they agree).
__all__ = sorted(_MODULES)
