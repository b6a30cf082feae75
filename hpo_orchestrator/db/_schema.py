"""This product's own tables, beside Optuna's in the same database.

- ``hpo_telemetry``: one row per sample per trial (the time series).
- ``hpo_trial_summary``: one narrow, numeric row per finished trial (times as epoch seconds,
  device, telemetry aggregates), written when the trial is told. ``status`` aggregates it in
  one scan instead of decoding every trial's JSON user attrs (5-6x faster on 100k trials).
  Optuna's tables stay the authority: the same facts are in the trial's ``hpo.*`` attrs.
  A trial that ended outside the orchestrator (optuna's CLI, a reaped trial) gets its row when
  the next trial's end folds it into the study's tally (:mod:`._tally`), from those attrs.
- ``hpo_study_tally``: per study, the sums and counts of every finished trial up to a
  watermark, kept in the transaction of each trial's end, so ``status`` reads one row plus the
  trials since instead of every trial (docs/BENCHMARKS.md "status from a kept tally").

Both live in their own SQLAlchemy MetaData, so creating them never touches Optuna's schema
(and Optuna's migrations never see them). No foreign keys to ``trials``: a row of ours must
never block Optuna from deleting a study. On sqlite, triggers delete our rows with the
trials and studies Optuna deletes (``optuna delete-study``): sqlite gives a new row the
highest id plus one, so a deleted study's ids come back, and its rows of ours would be read
as the new study's (or collide with them: the end of the new trial 1 failed on
"UNIQUE constraint failed: hpo_trial_summary.trial_id"). PostgreSQL's sequences never hand
an id out twice: there such rows are only left over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, Column, DateTime, Float, Index, Integer, MetaData, String, Table, Text, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateIndex

from hpo_orchestrator.db._tally import FLAGGED_WHERE

__all__ = ["TELEMETRY_COLUMNS", "ensure_tables", "insert_samples", "insert_summary", "summary_table",
           "tally_table", "telemetry_table"]

_metadata = MetaData()

telemetry_table = Table(
    "hpo_telemetry", _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("trial_id", Integer, nullable=False),
    Column("ts", DateTime, nullable=False),  # UTC, naive (as Optuna's own columns are naive)
    Column("gpu_index", Integer, nullable=True),  # NVML index; NULL on a CPU slot
    # The whole GPU, as nvidia-smi shows it (shared when trials_per_gpu > 1).
    Column("sm_util", Float),
    Column("mem_used_mib", Float),
    Column("power_w", Float),
    Column("temp_c", Float),
    Column("phase", String(64)),
    # This trial's processes only: what the driver attributes to them, and their CPU/RSS.
    Column("proc_sm_util", Float),
    Column("proc_mem_mib", Float),
    Column("cpu_util", Float),  # % of one core, summed over the process tree
    Column("rss_mib", Float),
    Index("ix_hpo_telemetry_trial_ts", "trial_id", "ts"),
)

TELEMETRY_COLUMNS = [c.name for c in telemetry_table.columns if c.name != "id"]

summary_table = Table(
    "hpo_trial_summary", _metadata,
    Column("trial_id", Integer, primary_key=True, autoincrement=False),
    Column("study_id", Integer, nullable=False, index=True),
    Column("number", Integer, nullable=False),
    Column("state", String(8), nullable=False),
    Column("host", String(255)),
    Column("gpu_index", Integer),  # NULL on a CPU slot
    Column("start_s", Float),  # epoch seconds (spawn)
    Column("end_s", Float),  # epoch seconds (told)
    Column("startup_s", Float),
    Column("first_decision_s", Float),
    Column("last_step", Integer),  # last reported step (the pruning step of a PRUNED trial)
    Column("gpu_util_mean", Float),
    Column("gpu_util_compute_mean", Float),
    Column("gpu_energy_j", Float),
    Column("gpu_verified", Boolean),
    Column("fail_reason", String(32)),
    Column("opencl_platform", String(255)),
    Column("params_mismatch", Text),  # JSON {name: [suggested, effective]}, NULL when none
)

# What status reads in order, so that a median is an OFFSET into an index instead of a sort
# of every row (trial_id last: the tally's watermark filter is answered from the index too).
# Partial indexes keep the rare rows (flags, failures) findable without a scan; their WHERE
# is the text of the queries that use them (db/_tally.py), as sqlite requires.
_SUMMARY_INDEXES = [
    Index("ix_hpo_summary_duration", summary_table.c.study_id, summary_table.c.state,
          text("(end_s - start_s)"), summary_table.c.trial_id),
    Index("ix_hpo_summary_startup", summary_table.c.study_id, summary_table.c.startup_s,
          summary_table.c.first_decision_s, summary_table.c.trial_id),
    Index("ix_hpo_summary_decision", summary_table.c.study_id, summary_table.c.first_decision_s,
          summary_table.c.startup_s, summary_table.c.trial_id),
    Index("ix_hpo_summary_flagged", summary_table.c.study_id, summary_table.c.trial_id,
          sqlite_where=text(FLAGGED_WHERE), postgresql_where=text(FLAGGED_WHERE)),
    Index("ix_hpo_summary_failed", summary_table.c.study_id, summary_table.c.trial_id,
          sqlite_where=text("state = 'FAIL'"), postgresql_where=text("state = 'FAIL'")),
]

tally_table = Table(
    "hpo_study_tally", _metadata,
    Column("study_id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),  # of the JSON below: another one is rebuilt
    Column("tally", Text, nullable=False),  # JSON, study/_tally.py
)


# sqlite: our rows go with the trial or study Optuna deletes (module docstring).
_SQLITE_TRIGGERS = {
    "hpo_forget_deleted_trial": (
        "CREATE TRIGGER hpo_forget_deleted_trial AFTER DELETE ON trials BEGIN "
        "DELETE FROM hpo_trial_summary WHERE trial_id = OLD.trial_id; "
        "DELETE FROM hpo_telemetry WHERE trial_id = OLD.trial_id; END"),
    "hpo_forget_deleted_study": (
        "CREATE TRIGGER hpo_forget_deleted_study AFTER DELETE ON studies BEGIN "
        "DELETE FROM hpo_study_tally WHERE study_id = OLD.study_id; END"),
}
# Rows of trials and studies deleted before the triggers existed (once, when they are made).
_SQLITE_ORPHANS = [
    "DELETE FROM hpo_trial_summary WHERE trial_id NOT IN (SELECT trial_id FROM trials)",
    "DELETE FROM hpo_telemetry WHERE trial_id NOT IN (SELECT trial_id FROM trials)",
    "DELETE FROM hpo_study_tally WHERE study_id NOT IN (SELECT study_id FROM studies)",
]


def ensure_tables(engine: Engine) -> None:
    """Create our tables (and indexes, and on sqlite the delete triggers) if missing; a no-op
    when they exist. The summary's indexes are created on their own: a table made by an older
    version has none of them (building them on 1M rows takes seconds, once)."""
    _metadata.create_all(engine, checkfirst=True)
    with engine.begin() as connection:
        for index in _SUMMARY_INDEXES:  # IF NOT EXISTS: reflection skips expression indexes
            connection.execute(CreateIndex(index, if_not_exists=True))
        if engine.dialect.name == "sqlite":
            made = {name for (name,) in connection.execute(text(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'hpo_%'"))}
            missing = [sql for name, sql in _SQLITE_TRIGGERS.items() if name not in made]
            for sql in missing:
                connection.execute(text(sql))
            if missing:
                for sql in _SQLITE_ORPHANS:
                    connection.execute(text(sql))


def insert_summary(connection: Connection, row: dict[str, Any]) -> None:
    """Within the caller's transaction (it writes the trial's other end-of-trial rows too). A
    trial ends once, so a row already there under its id is a deleted trial's, left by a
    version without the delete triggers, whose id sqlite gave out again: it is replaced."""
    connection.execute(summary_table.insert().prefix_with("OR REPLACE", dialect="sqlite"), [row])


def insert_samples(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        connection.execute(telemetry_table.insert(), list(rows))
