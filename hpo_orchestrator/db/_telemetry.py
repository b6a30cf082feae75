"""Reads of ``hpo_telemetry`` (db/tables.py makes it): the samples for the report's utilization
chart and for ``hpo-orchestrator telemetry --csv``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from hpo_orchestrator.db._sql import fetch_one, has_table, rows
from hpo_orchestrator.db._study import to_datetime
from hpo_orchestrator.db._trial_rows import has_summary_table

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable as Connection

__all__ = ["TELEMETRY_COLUMNS", "Sample", "has_telemetry_table", "has_trial", "telemetry_rows",
           "telemetry_samples"]

# hpo_telemetry's columns but its id, in the table's order (db/tables.py defines the table;
# tests/db/test_db_contract.py holds the two to each other).
TELEMETRY_COLUMNS = ("trial_id", "ts", "gpu_index", "sm_util", "mem_used_mib", "power_w", "temp_c",
                     "phase", "proc_sm_util", "proc_mem_mib", "cpu_util", "rss_mib")

_HAS_TRIAL_SQL = "SELECT 1 FROM trials WHERE study_id = :s AND number = :n"
_EXPORT_SQL = (
    "SELECT t.number, {columns} FROM hpo_telemetry h JOIN trials t "
    "ON t.trial_id = h.trial_id WHERE t.study_id = :s{one_trial} ORDER BY h.ts, t.number")
_ONE_TRIAL_SQL = " AND t.number = :n"
_SAMPLES_SQL = (
    "SELECT h.ts, h.trial_id, h.gpu_index, h.sm_util, h.cpu_util, {host} FROM hpo_telemetry h "
    "JOIN trials t ON t.trial_id = h.trial_id WHERE t.study_id = :s AND t.number >= :first ORDER BY h.ts")
_HOST_SQL = "(SELECT s.host FROM hpo_trial_summary s WHERE s.trial_id = h.trial_id)"


class Sample(NamedTuple):
    ts: datetime  # naive UTC
    trial_id: int
    gpu_index: int | None
    sm_util: float | None  # the whole card's SM utilization
    cpu_util: float | None  # the trial's process tree, % of one core
    host: str | None  # None where the trial has no summary row


def has_telemetry_table(connection: Connection) -> bool:
    """False when no study in this database ran with our telemetry."""
    return has_table(connection, "hpo_telemetry")


def has_trial(connection: Connection, study_id: int, number: int) -> bool:
    return fetch_one(connection, _HAS_TRIAL_SQL, {"s": study_id, "n": number}) is not None


def telemetry_rows(connection: Connection, study_id: int,
                   trial_number: int | None) -> list[tuple[Any, ...]]:
    """(trial number, *TELEMETRY_COLUMNS) of the study's samples (or one trial's), by time."""
    sql = _EXPORT_SQL.format(columns=", ".join(f"h.{c}" for c in TELEMETRY_COLUMNS),
                             one_trial=_ONE_TRIAL_SQL if trial_number is not None else "")
    return [tuple(row) for row in rows(connection, sql, {"s": study_id, "n": trial_number})]


def telemetry_samples(connection: Connection, study_id: int, first: int = 0) -> list[Sample]:
    """The study's samples by time, with each trial's host (from its summary row), for the
    trials from number ``first`` on."""
    host = _HOST_SQL if has_summary_table(connection) else "NULL"
    samples = []
    for ts, trial, gpu, sm, cpu, where in rows(connection, _SAMPLES_SQL.format(host=host),
                                               {"s": study_id, "first": first}):
        moment = to_datetime(ts)
        assert moment is not None  # the column is NOT NULL
        samples.append(Sample(moment, int(trial), None if gpu is None else int(gpu), sm, cpu, where))
    return samples
