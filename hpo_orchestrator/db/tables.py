"""This product's own tables, beside Optuna's in the same database.

- ``hpo_telemetry``: one row per sample per trial (the time series).
- ``hpo_trial_summary``: one narrow, numeric row per finished trial (times as epoch seconds,
  device, telemetry aggregates), written when the trial is told; its columns are the fields
  of ``SummaryRow`` (db/_summary.py), and a table made before a field existed gets its column
  at the next run's start (:func:`ensure_tables`: ``create_all`` never adds one). ``status`` aggregates it in
  one scan instead of decoding every trial's JSON user attrs (5-6x faster on 100k trials).
  Optuna's tables stay the authority: the same facts are in the trial's ``hpo.*`` attrs.
  A trial that ended outside the orchestrator (optuna's CLI, a reaped trial) gets its row when
  the next trial's end folds it into the study's tally (tally/_tally.py), from those attrs.
- ``hpo_study_tally``: per study, the sums and counts of every finished trial up to a
  watermark, kept in the transaction of each trial's end, so ``status`` reads one row plus the
  trials since instead of every trial (docs/BENCHMARKS.md "status from a kept tally").

A public module of db/, apart from the package's face, as db/connect.py: the tables are
SQLAlchemy's, and a run (which makes and writes them) imports it by name.

They live in their own SQLAlchemy MetaData, so creating them never touches Optuna's schema
(and Optuna's migrations never see them). No foreign keys to ``trials``: a row of ours must
never block Optuna from deleting a study. On sqlite, triggers delete our rows with the
trials and studies Optuna deletes (``optuna delete-study``): sqlite gives a new row the
highest id plus one, so a deleted study's ids come back, and its rows of ours would be read
as the new study's (or collide with them: a new trial's summary row under an id already
there). PostgreSQL's sequences never hand an id out twice: there such rows are only left
over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import Field, fields
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    text,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateIndex

from hpo_orchestrator.db._summary import FLAGGED_WHERE, SummaryRow
from hpo_orchestrator.errors import RuntimeFailure

__all__ = ["add_summary_columns", "ensure_tables", "insert_samples", "insert_summary", "summary_table",
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

# Its columns are SummaryRow's fields (db/_summary.py); ensure_tables adds the ones an older
# table lacks.
_TYPES: dict[str, Any] = {"int": Integer, "float": Float, "bool": Boolean, "json": Text}


def _summary_column(f: Field[Any]) -> Column[Any]:
    kind, length = f.metadata["kind"], f.metadata["length"]
    return Column(f.name, String(length) if kind == "str" else _TYPES[kind](),
                  **f.metadata["options"])


summary_table = Table("hpo_trial_summary", _metadata, *map(_summary_column, fields(SummaryRow)))

# What status reads in order, so that a median is an OFFSET into an index instead of a sort
# of every row (trial_id last: the tally's watermark filter is answered from the index too).
# Partial indexes keep the rare rows (flags, failures) findable without a scan; their WHERE
# is the text of the queries that use them (tally/_tally.py), as sqlite requires. On
# PostgreSQL the same WHERE is set when the tables are ensured (_partial): a postgresql_where
# given here imports SQLAlchemy's PostgreSQL dialect (0.05 s) into every run on sqlite.
_PARTIAL_WHERE = {"ix_hpo_summary_flagged": FLAGGED_WHERE, "ix_hpo_summary_failed": "state = 'FAIL'"}
_SUMMARY_INDEXES = [
    Index("ix_hpo_summary_duration", summary_table.c.study_id, summary_table.c.state,
          text("(end_s - start_s)"), summary_table.c.trial_id),
    Index("ix_hpo_summary_startup", summary_table.c.study_id, summary_table.c.startup_s,
          summary_table.c.first_decision_s, summary_table.c.trial_id),
    Index("ix_hpo_summary_decision", summary_table.c.study_id, summary_table.c.first_decision_s,
          summary_table.c.startup_s, summary_table.c.trial_id),
    *(Index(name, summary_table.c.study_id, summary_table.c.trial_id, sqlite_where=text(where))
      for name, where in _PARTIAL_WHERE.items()),
]


def _partial(index: Index, dialect: str) -> None:
    """Give ``index`` its WHERE for ``dialect`` (sqlite's is given above)."""
    where = _PARTIAL_WHERE.get(str(index.name))
    if where is not None and dialect == "postgresql" \
            and index.dialect_kwargs.get("postgresql_where") is None:
        index.dialect_kwargs["postgresql_where"] = text(where)  # the dialect is loaded by now

tally_table = Table(
    "hpo_study_tally", _metadata,
    Column("study_id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),  # of the JSON below: another one is rebuilt
    Column("tally", Text, nullable=False),  # JSON, tally/_tally.py
)


# A SummaryRow field that an older version's table lacks (add_summary_columns).
_ADD_COLUMN_SQL = "ALTER TABLE hpo_trial_summary ADD COLUMN {name} {kind}"

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
    when they exist. A summary table made by an older version gets the columns it lacks, and
    the summary's indexes are created on their own: such a table may have none of them
    (building them on 1M rows takes seconds, once)."""
    for index in _SUMMARY_INDEXES:  # create_all makes a new table's indexes too
        _partial(index, engine.dialect.name)
    _metadata.create_all(engine, checkfirst=True)
    add_summary_columns(engine)
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


def add_summary_columns(engine: Engine) -> list[str]:
    """``ALTER TABLE hpo_trial_summary ADD COLUMN`` for each SummaryRow field its table lacks
    (a database of an older version), then checked: every field has its column. Returns the
    columns added. Each is nullable (a test holds SummaryRow to it), so the rows already there
    get NULL, as status reads a fact that was not recorded. Another orchestrator adding the
    same column at the same moment is no error (the run's set-up lock makes it rare)."""
    had = _summary_columns_of(engine)
    added = []
    for column in summary_table.columns:
        if column.name in had:
            continue
        kind = column.type.compile(dialect=engine.dialect)
        name = engine.dialect.identifier_preparer.quote(column.name)
        try:
            with engine.begin() as connection:
                connection.execute(text(_ADD_COLUMN_SQL.format(name=name, kind=kind)))
        except DBAPIError:
            if column.name not in _summary_columns_of(engine):
                raise
        added.append(column.name)
    now = _summary_columns_of(engine) if added else had
    missing = [c.name for c in summary_table.columns if c.name not in now]
    if missing:  # e.g. a dialect that ignored the statement
        raise RuntimeFailure(f"hpo_trial_summary lacks the columns {missing} after adding them",
                             "add them by hand (docs/DESIGN.md §2.4 lists the table's columns)")
    return added


def _summary_columns_of(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        return {c["name"] for c in inspect(connection).get_columns("hpo_trial_summary")}


def insert_summary(connection: Connection, row: SummaryRow | dict[str, Any]) -> None:
    """Within the caller's transaction (it writes the trial's other end-of-trial rows too). A
    trial ends once, so a row already there under its id is a deleted trial's, left by a
    version without the delete triggers, whose id sqlite gave out again: it is replaced.
    (A dict: the columns given, for tests that need only some.)"""
    values = row.values() if isinstance(row, SummaryRow) else row
    connection.execute(summary_table.insert().prefix_with("OR REPLACE", dialect="sqlite"),
                       [values])


def insert_samples(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        connection.execute(telemetry_table.insert(), list(rows))
