"""What the orchestrator reads and writes beside Optuna's storage API during a run.

Each statement either saves Optuna's ORM a per-key transaction (several user attrs in one),
or reads one value where Optuna's ``get_trials`` would load every trial of the study (11 s on
a 20,000-trial study). Rows are written exactly as Optuna writes them (key, JSON value).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, Text, text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._study import state_name

__all__ = ["attempt_of", "max_completed_step", "never_beat", "next_waiting_retry_reason",
           "running_with_host_pid", "set_trial_end", "write_trial_attrs"]

_TRIAL_STATE_SQL = "SELECT state FROM trials WHERE trial_id = :t"
_SET_START_SQL = "UPDATE trials SET datetime_start = :d WHERE trial_id = :t"
_SET_END_SQL = "UPDATE trials SET datetime_complete = :d WHERE trial_id = :t"
_ATTEMPT_SQL = "SELECT value_json FROM trial_user_attributes WHERE trial_id = :t AND key = 'hpo.attempt'"
_NEXT_RETRY_REASON_SQL = (
    "SELECT a.value_json FROM trials t LEFT JOIN trial_user_attributes a "
    "ON a.trial_id = t.trial_id AND a.key = 'hpo.retry_reason' "
    "WHERE t.study_id = :s AND t.state = 'WAITING' ORDER BY t.trial_id LIMIT 1")
_RUNNING_HOST_PID_SQL = (
    "SELECT t.trial_id, h.value_json, p.value_json FROM trials t "
    "JOIN trial_user_attributes h ON h.trial_id = t.trial_id AND h.key = 'hpo.host' "
    "JOIN trial_user_attributes p ON p.trial_id = t.trial_id AND p.key = 'hpo.pid' "
    "WHERE t.study_id = :s AND t.state = 'RUNNING'")
_NEVER_BEAT_SQL = (
    "SELECT t.trial_id FROM trials t WHERE t.study_id = :s AND t.state = 'RUNNING' "
    "AND t.datetime_start < :cutoff AND NOT EXISTS (SELECT 1 FROM trial_heartbeats h "
    "WHERE h.trial_id = t.trial_id)")
_MAX_COMPLETED_STEP_SQL = (
    "SELECT MAX(iv.step) FROM trial_intermediate_values iv JOIN trials t "
    "ON t.trial_id = iv.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE'")

# Optuna's table of trial user attrs, for replacing several keys in one statement each.
_user_attrs = Table(
    "trial_user_attributes", MetaData(),
    Column("trial_user_attribute_id", Integer, primary_key=True),
    Column("trial_id", Integer),
    Column("key", String(512)),
    Column("value_json", Text),
)


def write_trial_attrs(connection: Connection, trial_id: int, number: int, attrs: dict[str, Any],
                      started: datetime | None = None) -> None:
    """Set several user attrs of a RUNNING trial (and move its start to ``started``), within
    the caller's transaction.

    Optuna's set_user_attr costs one transaction (about 5 ms through its ORM) per key; a
    trial gets about 15 keys, and the orchestrator's loop is the one writer for all slots.
    Like Optuna, only while the trial is RUNNING: else UpdateFinishedTrialError.
    """
    state = connection.execute(text(_TRIAL_STATE_SQL), {"t": trial_id}).scalar()
    if state_name(state) != "RUNNING":
        from optuna.exceptions import UpdateFinishedTrialError  # off the readers' import path

        raise UpdateFinishedTrialError(
            f"trial {number} is {state}; its attrs cannot change")
    connection.execute(_user_attrs.delete().where(_user_attrs.c.trial_id == trial_id,
                                                  _user_attrs.c.key.in_(list(attrs))))
    connection.execute(_user_attrs.insert(), [
        {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
        for key, value in attrs.items()])
    if started is not None:
        connection.execute(text(_SET_START_SQL), {"d": started, "t": trial_id})


def set_trial_end(connection: Connection, trial_id: int, ended: datetime) -> None:
    """Optuna sets datetime_complete at tell(); the trial's own end may be earlier."""
    connection.execute(text(_SET_END_SQL), {"d": ended, "t": trial_id})


def attempt_of(connection: Connection, trial_id: int) -> int:
    """The trial's ``hpo.attempt`` (1 when absent: not a retry)."""
    value = connection.execute(text(_ATTEMPT_SQL), {"t": trial_id}).scalar()
    return int(json.loads(value)) if value else 1


def next_waiting_retry_reason(connection: Connection, study_id: int) -> Any:
    """``hpo.retry_reason`` of the WAITING trial the next ask() takes (None: no WAITING
    trial, or it is not a retry)."""
    row = connection.execute(text(_NEXT_RETRY_REASON_SQL), {"s": study_id}).first()
    return None if row is None or row[0] is None else json.loads(row[0])


def running_with_host_pid(connection: Connection, study_id: int) -> list[tuple[int, Any, Any]]:
    """(trial_id, hpo.host, hpo.pid) of the study's RUNNING trials that have both attrs."""
    rows = connection.execute(text(_RUNNING_HOST_PID_SQL), {"s": study_id}).all()
    return [(int(trial_id), json.loads(host), json.loads(pid)) for trial_id, host, pid in rows]


def never_beat(connection: Connection, study_id: int, started_before: datetime) -> list[int]:
    """RUNNING trials without any heartbeat row, started before ``started_before`` (local
    time, as Optuna stores datetime_start)."""
    rows = connection.execute(text(_NEVER_BEAT_SQL), {"s": study_id, "cutoff": started_before})
    return [int(tid) for (tid,) in rows]


def max_completed_step(connection: Connection, study_id: int) -> int | None:
    """The last step any COMPLETE trial of the study reported."""
    value = connection.execute(text(_MAX_COMPLETED_STEP_SQL), {"s": study_id}).scalar()
    return None if value is None else int(value)
