"""Reads of ``hpo_telemetry`` (:mod:`._schema`): the samples for the report's utilization chart
and for ``hpo-orchestrator telemetry --csv``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._schema import TELEMETRY_COLUMNS
from hpo_orchestrator.db._study import to_datetime
from hpo_orchestrator.db._trials import has_summary_table

__all__ = ["Sample", "has_telemetry_table", "has_trial", "telemetry_rows", "telemetry_samples"]

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
    return inspect(connection).has_table("hpo_telemetry")


def has_trial(connection: Connection, study_id: int, number: int) -> bool:
    return connection.execute(text(_HAS_TRIAL_SQL), {"s": study_id, "n": number}).first() is not None


def telemetry_rows(connection: Connection, study_id: int,
                   trial_number: int | None) -> list[tuple[Any, ...]]:
    """(trial number, *TELEMETRY_COLUMNS) of the study's samples (or one trial's), by time."""
    sql = _EXPORT_SQL.format(columns=", ".join(f"h.{c}" for c in TELEMETRY_COLUMNS),
                             one_trial=_ONE_TRIAL_SQL if trial_number is not None else "")
    return [tuple(row) for row in connection.execute(text(sql), {"s": study_id, "n": trial_number})]


def telemetry_samples(connection: Connection, study_id: int, first: int = 0) -> list[Sample]:
    """The study's samples by time, with each trial's host (from its summary row), for the
    trials from number ``first`` on."""
    host = _HOST_SQL if has_summary_table(connection) else "NULL"
    samples = []
    for ts, trial, gpu, sm, cpu, where in connection.execute(text(_SAMPLES_SQL.format(host=host)),
                                                             {"s": study_id, "first": first}):
        moment = to_datetime(ts)
        assert moment is not None  # the column is NOT NULL
        samples.append(Sample(moment, int(trial), None if gpu is None else int(gpu), sm, cpu, where))
    return samples
