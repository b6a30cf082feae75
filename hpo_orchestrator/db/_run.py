"""What the orchestrator reads and writes beside Optuna's storage API during a run.

Each statement either saves Optuna's ORM a per-key transaction (several user attrs in one),
or reads one value where Optuna's ``get_trials`` would load every trial of the study (11 s on
a 20,000-trial study). Rows are written exactly as Optuna writes them (key, JSON value).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, Text, bindparam, text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._study import state_name, to_datetime

__all__ = ["RunningOnHost", "attempt_of", "enqueue_waiting_trial", "fail_running_trial",
           "max_completed_step", "never_beat", "next_waiting_retry_reason", "no_longer_running",
           "running_on_host", "write_trial_attrs"]

_TRIAL_STATE_SQL = "SELECT state FROM trials WHERE trial_id = :t"
# A no-op update that holds the trial's row (PostgreSQL: until the transaction ends) while
# it is RUNNING, so a reaper on another host cannot fail it between the check and the writes.
_HOLD_RUNNING_SQL = "UPDATE trials SET state = state WHERE trial_id = :t AND state = 'RUNNING'"
_FAIL_RUNNING_SQL = (
    "UPDATE trials SET state = 'FAIL', datetime_complete = :d WHERE trial_id = :t "
    "AND state = 'RUNNING'")
# Optuna's _create_new_trial: the study's row locked (PostgreSQL), the trial inserted, its
# number = the study's trials before it. sqlite's write lock serializes the same steps.
_LOCK_STUDY_ROW_SQL = "SELECT study_id FROM studies WHERE study_id = :s FOR UPDATE"
_INSERT_WAITING_SQL = "INSERT INTO trials (study_id, state) VALUES (:s, 'WAITING') RETURNING trial_id"
_PAST_TRIALS_SQL = "SELECT COUNT(*) FROM trials WHERE study_id = :s AND trial_id < :t"
_SET_NUMBER_SQL = "UPDATE trials SET number = :n WHERE trial_id = :t"
_INSERT_SYSTEM_ATTR_SQL = (
    "INSERT INTO trial_system_attributes (trial_id, key, value_json) VALUES (:t, :k, :v)")
_SET_START_SQL = "UPDATE trials SET datetime_start = :d WHERE trial_id = :t"
_ATTEMPT_SQL = "SELECT value_json FROM trial_user_attributes WHERE trial_id = :t AND key = 'hpo.attempt'"
_NEXT_RETRY_REASON_SQL = (
    "SELECT a.value_json FROM trials t LEFT JOIN trial_user_attributes a "
    "ON a.trial_id = t.trial_id AND a.key = 'hpo.retry_reason' "
    "WHERE t.study_id = :s AND t.state = 'WAITING' ORDER BY t.trial_id LIMIT 1")
_RUNNING_ON_HOST_SQL = (
    "SELECT t.trial_id, t.datetime_start, p.value_json, o.value_json FROM trials t "
    "JOIN trial_user_attributes h ON h.trial_id = t.trial_id AND h.key = 'hpo.host' "
    "LEFT JOIN trial_user_attributes p ON p.trial_id = t.trial_id AND p.key = 'hpo.pid' "
    "LEFT JOIN trial_user_attributes o ON o.trial_id = t.trial_id "
    "AND o.key = 'hpo.orchestrator_pid' "
    "WHERE t.study_id = :s AND t.state = 'RUNNING' AND h.value_json = :h")
_NEVER_BEAT_SQL = (
    "SELECT t.trial_id FROM trials t WHERE t.study_id = :s AND t.state = 'RUNNING' "
    "AND t.datetime_start < :cutoff AND NOT EXISTS (SELECT 1 FROM trial_heartbeats h "
    "WHERE h.trial_id = t.trial_id)")
_NO_LONGER_RUNNING_SQL = "SELECT trial_id FROM trials WHERE trial_id IN :ids AND state != 'RUNNING'"
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
    Like Optuna, only while the trial is RUNNING: else UpdateFinishedTrialError. The trial's
    row stays held until the caller's transaction ends (see _HOLD_RUNNING_SQL).
    """
    if connection.execute(text(_HOLD_RUNNING_SQL), {"t": trial_id}).rowcount != 1:
        from optuna.exceptions import UpdateFinishedTrialError  # off the readers' import path

        state = connection.execute(text(_TRIAL_STATE_SQL), {"t": trial_id}).scalar()
        raise UpdateFinishedTrialError(f"trial {number} is {state_name(state)}; its attrs cannot change")
    if attrs:
        connection.execute(_user_attrs.delete().where(_user_attrs.c.trial_id == trial_id,
                                                      _user_attrs.c.key.in_(list(attrs))))
        connection.execute(_user_attrs.insert(), [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in attrs.items()])
    if started is not None:
        connection.execute(text(_SET_START_SQL), {"d": started, "t": trial_id})


def fail_running_trial(connection: Connection, trial_id: int) -> bool:
    """RUNNING -> FAIL, as Optuna's set_trial_state_values does; False when the trial had
    already finished (another orchestrator reaped it first)."""
    done = connection.execute(text(_FAIL_RUNNING_SQL), {"t": trial_id, "d": datetime.now()})
    return done.rowcount == 1


def enqueue_waiting_trial(connection: Connection, study_id: int, params: dict[str, Any],
                          user_attrs: dict[str, Any]) -> int:
    """A WAITING trial with fixed params, written as Optuna's ``Study.enqueue_trial`` writes
    it (system attr ``fixed_params``), within the caller's transaction; its trial_id.

    Optuna's enqueue commits on its own: a retry enqueued that way and the ``hpo.retried``
    mark of the failed attempt could be split by a crash (a retried trial without a retry,
    issue 15). Here both commit together.
    """
    if connection.dialect.name != "sqlite":
        connection.execute(text(_LOCK_STUDY_ROW_SQL), {"s": study_id})
    trial_id = int(connection.execute(text(_INSERT_WAITING_SQL), {"s": study_id}).scalar_one())
    number = connection.execute(text(_PAST_TRIALS_SQL), {"s": study_id, "t": trial_id}).scalar()
    connection.execute(text(_SET_NUMBER_SQL), {"n": int(number or 0), "t": trial_id})
    connection.execute(text(_INSERT_SYSTEM_ATTR_SQL), {
        "t": trial_id, "k": "fixed_params", "v": json.dumps(params)})
    if user_attrs:
        connection.execute(_user_attrs.insert(), [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in user_attrs.items()])
    return trial_id


def attempt_of(connection: Connection, trial_id: int) -> int:
    """The trial's ``hpo.attempt`` (1 when absent: not a retry)."""
    value = connection.execute(text(_ATTEMPT_SQL), {"t": trial_id}).scalar()
    return int(json.loads(value)) if value else 1


def next_waiting_retry_reason(connection: Connection, study_id: int) -> Any:
    """``hpo.retry_reason`` of the WAITING trial the next ask() takes (None: no WAITING
    trial, or it is not a retry)."""
    row = connection.execute(text(_NEXT_RETRY_REASON_SQL), {"s": study_id}).first()
    return None if row is None or row[0] is None else json.loads(row[0])


@dataclass(frozen=True)
class RunningOnHost:
    """A RUNNING trial asked or started on one host: who holds it."""

    trial_id: int
    started: datetime | None  # local time, as Optuna stores it
    pid: Any  # hpo.pid: its child (None: no slot took it yet)
    orchestrator_pid: Any  # hpo.orchestrator_pid (None: recorded by an older version)


def running_on_host(connection: Connection, study_id: int, host: str) -> list[RunningOnHost]:
    """The study's RUNNING trials whose ``hpo.host`` is ``host``."""
    rows = connection.execute(text(_RUNNING_ON_HOST_SQL), {"s": study_id, "h": json.dumps(host)})
    return [RunningOnHost(int(trial_id), None if start is None else to_datetime(start),
                          None if pid is None else json.loads(pid),
                          None if orchestrator is None else json.loads(orchestrator))
            for trial_id, start, pid, orchestrator in rows]


def never_beat(connection: Connection, study_id: int, started_before: datetime) -> list[int]:
    """RUNNING trials without any heartbeat row, started before ``started_before`` (local
    time, as Optuna stores datetime_start)."""
    rows = connection.execute(text(_NEVER_BEAT_SQL), {"s": study_id, "cutoff": started_before})
    return [int(tid) for (tid,) in rows]


def no_longer_running(connection: Connection, trial_ids: list[int]) -> set[int]:
    """Those of ``trial_ids`` that are not RUNNING any more (another orchestrator reaped
    them): one indexed read of a handful of rows, for every heartbeat round."""
    if not trial_ids:
        return set()
    statement = text(_NO_LONGER_RUNNING_SQL).bindparams(bindparam("ids", expanding=True))
    return {int(tid) for (tid,) in connection.execute(statement, {"ids": trial_ids})}


def max_completed_step(connection: Connection, study_id: int) -> int | None:
    """The last step any COMPLETE trial of the study reported."""
    value = connection.execute(text(_MAX_COMPLETED_STEP_SQL), {"s": study_id}).scalar()
    return None if value is None else int(value)
