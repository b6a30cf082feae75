"""The one gateway to the database: the only code that knows Optuna's tables and ours.

Every SQL statement of the project lives in this package (docs/DESIGN.md §3.2), as a
module-level ``_..._SQL`` constant, so tests/test_db_contract.py can run each one against a
database made by the installed Optuna. Modules by concern:

- ``_engine``: URLs, engines (sqlite tuned for a long run), the locks between orchestrators;
- ``_version``: the Optuna schema revision a database must have, checked at open;
- ``_sql``: running a statement on a SQLAlchemy connection or a plain ``sqlite3`` one;
- ``_sqlite``: a plain sqlite study opened read-only with ``sqlite3`` alone (``status --json``);
- ``_schema``: our own tables (``hpo_telemetry``, ``hpo_trial_summary``), and the summary's
  columns that a table of an older version lacks, added at a run's start;
- ``_summary``: ``SummaryRow``, the summary row's one definition (columns, the attrs each
  copies);
- ``_study``: study lookup, direction, our study attrs, read errors;
- ``_trials``: one narrow row per trial, counts, best trial, heartbeats (status, report);
- ``_curves``: learning curves and step timings (tune-pruner, min_resource=auto);
- ``_telemetry``: reads of the samples (report, telemetry export);
- ``_budget``: the statements behind the shared trial budget;
- ``_run``: what the orchestrator reads and writes beside Optuna's storage API during a run;
- ``_mirror``, ``_batch``: the bulk reads behind the run's mirror of its study, and a trial's
  end written in one transaction (study/_storage.py);
- ``_retention``: old trials' telemetry averaged down to a bounded number of rows;
- ``_retry``: storage trouble during a run: its cause, retries for ``storage.retry_s``;
- ``_best``: directions, the best trial or Pareto front, a trial's params (``best``);
- ``_detail``: one trial in full, the failures' errors, the most recently run study;
- ``_artifacts``: the artifacts Optuna's meta lists on trials, and the store each went to;
- ``_tally``: a study's kept tally, the trials since it, and status's reads of the summary's
  indexes (medians, flags, failures) up to its watermark.

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
    from hpo_orchestrator.db._artifacts import StoredArtifact, trial_artifacts
    from hpo_orchestrator.db._attr_shapes import well_formed
    from hpo_orchestrator.db._batch import finish_trial, write_param, write_steps
    from hpo_orchestrator.db._best import (
        ScoredTrial,
        best_trials,
        pareto_front,
        study_directions,
        study_space,
        trial_params,
    )
    from hpo_orchestrator.db._budget import (
        claimed_rows_after,
        count_claimed,
        count_claimed_upto,
        count_running,
        lock_study_budget,
        settled_upto,
    )
    from hpo_orchestrator.db._curves import (
        CurveTrial,
        first_of_last,
        intermediate_values,
        step_timings,
        trials_with_values,
    )
    from hpo_orchestrator.db._detail import fail_errors, latest_study, trial_detail
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
    from hpo_orchestrator.db._mirror import (
        best_trial_ids,
        read_trials,
        recent_trial_ids,
        unfinished_trial_ids_before,
    )
    from hpo_orchestrator.db._outside import asked_outside
    from hpo_orchestrator.db._retention import RetentionRaced, downsample_trial, retention_candidates
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
    from hpo_orchestrator.db._sql import dialect
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
    from hpo_orchestrator.db._summary import SUMMARY_COLUMNS, SummaryRow
    from hpo_orchestrator.db._tally import (
        SinceTrial,
        existing_ids,
        fail_attrs,
        failed_upto,
        flags_upto,
        has_tally_table,
        ordered_window,
        read_tally,
        summarize,
        summary_count_upto,
        trials_since,
        write_tally,
    )
    from hpo_orchestrator.db._telemetry import (
        Sample,
        has_telemetry_table,
        has_trial,
        telemetry_rows,
        telemetry_samples,
    )
    from hpo_orchestrator.db._trials import (
        SummaryFlags,
        TrialRow,
        UncoveredTrial,
        best_of,
        best_trial,
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
    "dialect": "_sql",
    **dict.fromkeys(["finish_trial", "write_param", "write_steps"], "_batch"),
    **dict.fromkeys(["best_trial_ids", "read_trials", "recent_trial_ids",
                     "unfinished_trial_ids_before"], "_mirror"),
    **dict.fromkeys(["StoredArtifact", "trial_artifacts"], "_artifacts"),
    "well_formed": "_attr_shapes",
    **dict.fromkeys(["ScoredTrial", "best_trials", "pareto_front", "study_directions",
                     "study_space", "trial_params"], "_best"),
    **dict.fromkeys(["claimed_rows_after", "count_claimed", "count_claimed_upto", "count_running",
                     "lock_study_budget", "settled_upto"], "_budget"),
    **dict.fromkeys(["CurveTrial", "first_of_last", "intermediate_values", "step_timings",
                     "trials_with_values"], "_curves"),
    **dict.fromkeys(["fail_errors", "latest_study", "trial_detail"], "_detail"),
    **dict.fromkeys(["ADVISORY_NAMESPACE", "check_url", "create_engine", "file_lock", "lock_file",
                     "mask_url", "mask_url_in", "open_rdb_storage", "paste_url", "setup_lock",
                     "sqlite_path", "validated_path"], "_engine"),
    **dict.fromkeys(["RetentionRaced", "downsample_trial", "retention_candidates"], "_retention"),
    "asked_outside": "_outside",
    **dict.fromkeys(["Retrying", "StorageUnavailable", "first_line", "is_retried", "retried",
                     "retrying_of", "trouble_of"], "_retry"),
    **dict.fromkeys(["RunningTrialRow", "ask_running_trial", "attempt_of", "create_running_trial",
                     "enqueue_waiting_trial",
                     "fail_running_trial", "max_completed_step", "no_longer_running", "running_among",
                     "start_running_trial", "write_trial_attrs"], "_run"),
    **dict.fromkeys(["TELEMETRY_COLUMNS", "add_summary_columns", "ensure_tables", "insert_samples",
                     "insert_summary", "summary_table", "tally_table", "telemetry_table"], "_schema"),
    **dict.fromkeys(["SUMMARY_COLUMNS", "SummaryRow"], "_summary"),
    **dict.fromkeys(["UNREADABLE", "database_now", "list_studies", "read_errors", "state_name",
                     "study_attrs", "study_config", "study_id_of", "to_datetime"], "_study"),
    **dict.fromkeys(["SinceTrial", "existing_ids", "fail_attrs", "failed_upto", "flags_upto",
                     "has_tally_table", "ordered_window", "read_tally", "summarize",
                     "summary_count_upto", "trials_since", "write_tally"], "_tally"),
    **dict.fromkeys(["Sample", "has_telemetry_table", "has_trial", "telemetry_rows",
                     "telemetry_samples"], "_telemetry"),
    **dict.fromkeys(["SummaryFlags", "TrialRow", "UncoveredTrial", "best_of", "best_trial",
                     "has_summary_table", "heartbeat_of", "state_counts", "summary_flags",
                     "summary_max_complete_step", "summary_prune_steps", "summary_rows", "trial_rows",
                     "trial_values", "uncovered_trials"], "_trials"),
    **dict.fromkeys(["SCHEMA_REVISION", "check_schema"], "_version"),
}


__getattr__ = lazy_getattr(__name__, _MODULES, globals())
# Every name of the table; the imports above name the same for type checkers
# (tests/test_imports.py checks that they agree).
__all__ = sorted(_MODULES)
