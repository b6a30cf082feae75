"""What the orchestrator reads and writes beside Optuna's storage API during a run.

Each statement either saves Optuna's ORM a per-key transaction (several user attrs in one),
or reads one value where Optuna's ``get_trials`` would load every trial of the study (11 s on
a 20,000-trial study). Rows are written exactly as Optuna writes them (key, JSON value).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import keys
from hpo_orchestrator.db._sql import dialect, execute_many, fetch_all, fetch_one, rows, scalar
from hpo_orchestrator.db._study import state_name, to_datetime

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable as Connection

__all__ = ["RunningTrialRow", "ask_running_trial", "attempt_of", "create_running_trial",
           "enqueue_waiting_trial", "fail_running_trial", "max_completed_step",
           "no_longer_running", "record_heartbeat", "requeue_unstarted_trial", "running_among",
           "start_running_trial", "write_trial_attrs"]

_TRIAL_STATE_SQL = "SELECT state FROM trials WHERE trial_id = :t"
# A no-op update that holds the trial's row (PostgreSQL: until the transaction ends) while
# it is RUNNING, so a reaper on another host cannot fail it between the check and the writes.
_HOLD_RUNNING_SQL = "UPDATE trials SET state = state WHERE trial_id = :t AND state = 'RUNNING'"
# Ours still: an asked-ahead trial requeued by another orchestrator while this one stood
# stopped (past the grace period) may have been asked again by another run: RUNNING, not ours.
_OWNED_SQL = ("SELECT COUNT(*) FROM trial_user_attributes WHERE trial_id = :t AND ("
              "(key = 'hpo.orchestrator_pid' AND value_json = :pid) OR "
              "(key = 'hpo.host' AND value_json = :host))")
_FAIL_RUNNING_SQL = (
    "UPDATE trials SET state = 'FAIL', datetime_complete = :d WHERE trial_id = :t "
    "AND state = 'RUNNING'")
# Optuna's _create_new_trial: the study's row locked (PostgreSQL), the trial inserted, its
# number = the study's trials before it. sqlite's write lock serializes the same steps.
_LOCK_STUDY_ROW_SQL = "SELECT study_id FROM studies WHERE study_id = :s FOR UPDATE"
_INSERT_WAITING_SQL = "INSERT INTO trials (study_id, state) VALUES (:s, 'WAITING') RETURNING trial_id"
_INSERT_RUNNING_SQL = ("INSERT INTO trials (study_id, state, datetime_start) "
                       "VALUES (:s, 'RUNNING', :d) RETURNING trial_id")
# The number of the study's trial just before: one step down the index on study_id, where
# Optuna's count of every earlier trial costs O(study) (8 ms per ask at 100,000 trials).
_PREVIOUS_NUMBER_SQL = ("SELECT number FROM trials WHERE study_id = :s AND trial_id < :t "
                        "ORDER BY trial_id DESC LIMIT 1")
_PAST_TRIALS_SQL = "SELECT COUNT(*) FROM trials WHERE study_id = :s AND trial_id < :t"
_SET_NUMBER_SQL = "UPDATE trials SET number = :n WHERE trial_id = :t"
_INSERT_SYSTEM_ATTR_SQL = (
    "INSERT INTO trial_system_attributes (trial_id, key, value_json) VALUES (:t, :k, :v)")
_SET_START_SQL = "UPDATE trials SET datetime_start = :d WHERE trial_id = :t"
# The database's clock, as Optuna's record_heartbeat stamps it (func.current_timestamp()).
_FIRST_HEARTBEAT_SQL = "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (:t, {now})"
# A heartbeat stamped when the row is written, not before: Optuna's record_heartbeat reads the
# clock first and then waits for the write lock, so a 30 s lock held by another process stored
# a heartbeat 30 s old, past the grace period, and reaping then failed the run's own live
# trial as lost. sqlite evaluates CURRENT_TIMESTAMP as the statement writes (after its lock);
# PostgreSQL's CURRENT_TIMESTAMP is the transaction's start, clock_timestamp() the moment, and
# an UPDATE computes its new row before it waits for the row's lock: the lock is taken first.
_LOCK_HEARTBEAT_SQL = "SELECT trial_id FROM trial_heartbeats WHERE trial_id = :t FOR UPDATE"
_HEARTBEAT_SQL = "UPDATE trial_heartbeats SET heartbeat = {now} WHERE trial_id = :t"
_NEW_HEARTBEAT_SQL = "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (:t, {now})"
# sqlite's CURRENT_TIMESTAMP has whole seconds: a lost trial ended at its last sign of life
# (scheduler/_recovery.last_alive) could then end up to a second before its last report. Its
# clock read to the millisecond, written as SQLAlchemy writes a datetime (microseconds).
_NOW = {"postgresql": "clock_timestamp()", "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"}
# An asked-ahead trial no slot took goes back to the queue as the WAITING trial it would have
# been: no start, no heartbeat, and no owner (a reaper would else take the next run's ask of it,
# in the moment before its new owner is written, for an orphan of the dead one).
_REQUEUE_SQL = ("UPDATE trials SET state = 'WAITING', datetime_start = NULL WHERE trial_id = :t "
                "AND state = 'RUNNING'")
_FORGET_BEAT_SQL = "DELETE FROM trial_heartbeats WHERE trial_id = :t"
_FORGET_OWNER_SQL = ("DELETE FROM trial_user_attributes WHERE trial_id = :t "
                     "AND key IN ('hpo.host', 'hpo.orchestrator_pid')")
_ATTEMPT_SQL = "SELECT value_json FROM trial_user_attributes WHERE trial_id = :t AND key = 'hpo.attempt'"
# An ask's earlier try: the study's RUNNING trials started at that instant (about one), then
# their attrs (only on a retry: never on a run's every ask)
_STARTED_AT_SQL = ("SELECT trial_id, number FROM trials WHERE study_id = :s AND state = 'RUNNING' "
                   "AND datetime_start = :d")
_ATTRS_OF_SQL = "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = :t"
# Reaping reads only the trials the caller names (the run's mirror knows the unfinished
# ones): a filter on state over the study's trials would scan all of them (about 25 ms a
# statement at 100,000 trials, three of them every heartbeat round).
_RUNNING_AMONG_SQL = (
    "SELECT t.trial_id, t.datetime_start, b.heartbeat, {now}, h.value_json, "
    "p.value_json, o.value_json, r.value_json FROM trials t "
    "LEFT JOIN trial_heartbeats b ON b.trial_id = t.trial_id "
    "LEFT JOIN trial_user_attributes h ON h.trial_id = t.trial_id AND h.key = 'hpo.host' "
    "LEFT JOIN trial_user_attributes p ON p.trial_id = t.trial_id AND p.key = 'hpo.pid' "
    "LEFT JOIN trial_user_attributes o ON o.trial_id = t.trial_id "
    "AND o.key = 'hpo.orchestrator_pid' "
    "LEFT JOIN trial_user_attributes r ON r.trial_id = t.trial_id AND r.key = 'hpo.retry_of' "
    "WHERE t.trial_id IN :ids AND t.state = 'RUNNING'")
_NO_LONGER_RUNNING_SQL = "SELECT trial_id FROM trials WHERE trial_id IN :ids AND state != 'RUNNING'"
_MAX_COMPLETED_STEP_SQL = (
    "SELECT MAX(iv.step) FROM trial_intermediate_values iv JOIN trials t "
    "ON t.trial_id = iv.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE'")
# Several user attrs of a trial replaced in two statements (one for all the keys, one batch).
_DELETE_ATTRS_SQL = "DELETE FROM trial_user_attributes WHERE trial_id = :t AND key IN :keys"
_INSERT_ATTR_SQL = ("INSERT INTO trial_user_attributes (trial_id, key, value_json) "
                    "VALUES (:trial_id, :key, :value_json)")


def write_trial_attrs(connection: Connection, trial_id: int, number: int, attrs: dict[str, Any],
                      started: datetime | None = None,
                      owner: tuple[str, int] | None = None) -> None:
    """Set several user attrs of a RUNNING trial (and move its start to ``started``), within
    the caller's transaction.

    Optuna's set_user_attr costs one transaction (about 5 ms through its ORM) per key; a
    trial gets about 15 keys, and the orchestrator's loop is the one writer for all slots.
    Like Optuna, only while the trial is RUNNING: else UpdateFinishedTrialError. The trial's
    row stays held until the caller's transaction ends (see _HOLD_RUNNING_SQL). With
    ``owner`` (host, orchestrator pid): also only while that orchestrator holds it (its
    ``hpo.host`` and ``hpo.orchestrator_pid``), else the same error.
    """
    if rows(connection, _HOLD_RUNNING_SQL, {"t": trial_id}).rowcount != 1:
        from optuna.exceptions import UpdateFinishedTrialError  # off the readers' import path

        state = scalar(connection, _TRIAL_STATE_SQL, {"t": trial_id})
        raise UpdateFinishedTrialError(f"trial {number} is {state_name(state)}; its attrs cannot change")
    if owner is not None and scalar(connection, _OWNED_SQL, {
            "t": trial_id, "host": json.dumps(owner[0]), "pid": json.dumps(owner[1])}) != 2:
        from optuna.exceptions import UpdateFinishedTrialError

        raise UpdateFinishedTrialError(f"trial {number} went back to the queue and another run "
                                       "asked it; its attrs cannot change")
    if attrs:
        rows(connection, _DELETE_ATTRS_SQL, {"t": trial_id, "keys": list(attrs)}, ["keys"])
        _insert_attrs(connection, trial_id, attrs)
    if started is not None:
        rows(connection, _SET_START_SQL, {"d": started, "t": trial_id})


def fail_running_trial(connection: Connection, trial_id: int, ended: datetime | None = None) -> bool:
    """RUNNING -> FAIL, as Optuna's set_trial_state_values does, ended at ``ended`` (local
    time, as Optuna's; None: now); False when the trial had already finished (another
    orchestrator reaped it first)."""
    done = rows(connection, _FAIL_RUNNING_SQL, {"t": trial_id, "d": ended or datetime.now()})
    return done.rowcount == 1


def enqueue_waiting_trial(connection: Connection, study_id: int, params: dict[str, Any],
                          user_attrs: dict[str, Any]) -> int:
    """A WAITING trial with fixed params, written as Optuna's ``Study.enqueue_trial`` writes
    it (system attr ``fixed_params``), within the caller's transaction; its trial_id.

    Optuna's enqueue commits on its own: a retry enqueued that way and the ``hpo.retried``
    mark of the failed attempt could be split by a crash (a retried trial without a retry).
    Here both commit together.
    """
    if dialect(connection) != "sqlite":
        rows(connection, _LOCK_STUDY_ROW_SQL, {"s": study_id})
    trial_id = int(rows(connection, _INSERT_WAITING_SQL, {"s": study_id}).scalar_one())
    _set_number(connection, study_id, trial_id)
    rows(connection, _INSERT_SYSTEM_ATTR_SQL, {"t": trial_id, "k": "fixed_params",
                                               "v": json.dumps(params)})
    _insert_attrs(connection, trial_id, user_attrs)
    return trial_id


def create_running_trial(connection: Connection, study_id: int, started: datetime) -> tuple[int, int]:
    """A new RUNNING trial, as Optuna's ``create_new_trial`` without a template writes it,
    within the caller's transaction: (trial_id, number)."""
    if dialect(connection) != "sqlite":
        rows(connection, _LOCK_STUDY_ROW_SQL, {"s": study_id})
    trial_id = int(rows(connection, _INSERT_RUNNING_SQL, {"s": study_id, "d": started},
                        datetimes=["d"]).scalar_one())
    return trial_id, _set_number(connection, study_id, trial_id)


def ask_running_trial(connection: Connection, study_id: int, started: datetime,
                      user_attrs: dict[str, Any] | None,
                      known: Collection[int] | None = None) -> tuple[int, int]:
    """(trial_id, number) of a new RUNNING trial (``create_running_trial``), with its
    ``user_attrs`` and first heartbeat (``start_running_trial``; None: neither). On a retry
    (``known``: the trial ids the caller holds), first the trial an earlier try created, where
    its commit went through and only the answer was lost (a dropped connection): RUNNING,
    started at the same instant, with the same attrs (this orchestrator's host and pid), not
    one the caller knows. Retried blindly, the ask made a second trial, and the first was
    reaped as 'lost' after the grace period: a FAIL in the study."""
    if known is not None and user_attrs:
        for trial_id, number in fetch_all(connection, _STARTED_AT_SQL, {"s": study_id, "d": started},
                                          datetimes=["d"]):
            written = {str(key): value for key, value in fetch_all(connection, _ATTRS_OF_SQL,
                                                                   {"t": trial_id})}
            if trial_id not in known and all(written.get(key) == json.dumps(value)
                                             for key, value in user_attrs.items()):
                return int(trial_id), int(number)
    trial_id, number = create_running_trial(connection, study_id, started)
    if user_attrs is not None:
        start_running_trial(connection, trial_id, user_attrs)
    return trial_id, number


def start_running_trial(connection: Connection, trial_id: int, user_attrs: dict[str, Any]) -> None:
    """The user attrs and first heartbeat of a trial just created in the caller's transaction
    (no attr or heartbeat row of it can exist yet)."""
    _insert_attrs(connection, trial_id, user_attrs)
    rows(connection, _FIRST_HEARTBEAT_SQL.format(now=_now(connection)), {"t": trial_id})


def _now(connection: Connection) -> str:
    """The database's clock, to the millisecond or finer, as SQL."""
    return _NOW.get(dialect(connection), "CURRENT_TIMESTAMP")


def requeue_unstarted_trial(connection: Connection, trial_id: int) -> bool:
    """A RUNNING trial that no slot took (asked ahead) back to WAITING, within the caller's
    transaction: it never ran, so it is no failure and has no duration; the next ask takes it
    (its number, and its fixed params if it was enqueued). False when it was not RUNNING any
    more (another orchestrator took care of it first)."""
    if rows(connection, _REQUEUE_SQL, {"t": trial_id}).rowcount != 1:
        return False
    rows(connection, _FORGET_BEAT_SQL, {"t": trial_id})
    rows(connection, _FORGET_OWNER_SQL, {"t": trial_id})
    return True


def record_heartbeat(connection: Connection, trial_id: int) -> None:
    """The trial's heartbeat, stamped by the database's clock once the write may proceed."""
    backend = dialect(connection)
    now = _now(connection)
    if backend == "postgresql":
        rows(connection, _LOCK_HEARTBEAT_SQL, {"t": trial_id})
    if rows(connection, _HEARTBEAT_SQL.format(now=now), {"t": trial_id}).rowcount == 0:
        rows(connection, _NEW_HEARTBEAT_SQL.format(now=now), {"t": trial_id})


def _insert_attrs(connection: Connection, trial_id: int, attrs: dict[str, Any]) -> None:
    """User attrs of a trial that has none of these keys (Optuna's representation: JSON)."""
    execute_many(connection, _INSERT_ATTR_SQL, [
        {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
        for key, value in attrs.items()])


def _set_number(connection: Connection, study_id: int, trial_id: int) -> int:
    """Number a trial just inserted (under the study's lock) as Optuna does: the count of
    the study's trials before it, which is the previous trial's number + 1 (trials are never
    deleted, and every writer numbers them the same way)."""
    previous = fetch_one(connection, _PREVIOUS_NUMBER_SQL, {"s": study_id, "t": trial_id})
    if previous is None:
        number = 0
    elif previous[0] is not None:
        number = int(previous[0]) + 1
    else:  # a trial without a number: only the count can tell
        number = int(scalar(connection, _PAST_TRIALS_SQL, {"s": study_id, "t": trial_id}) or 0)
    rows(connection, _SET_NUMBER_SQL, {"n": number, "t": trial_id})
    return number


def attempt_of(connection: Connection, trial_id: int) -> int:
    """The trial's ``hpo.attempt`` (1 when absent: not a retry)."""
    value = scalar(connection, _ATTEMPT_SQL, {"t": trial_id})
    return int(json.loads(value)) if value else 1


@dataclass(frozen=True)
class RunningTrialRow:
    """A RUNNING trial as reaping needs it: its clocks, and who holds it."""

    trial_id: int
    started: datetime | None  # local time, as Optuna stores it
    heartbeat: datetime | None  # the database's clock; None: it never beat
    now: datetime | None  # the database's clock when read
    host: Any  # hpo.host (None: no orchestrator of this project asked it)
    pid: Any  # hpo.pid: its child (None: no slot took it yet)
    orchestrator_pid: Any  # hpo.orchestrator_pid (None: recorded by an older version)
    retry_of: Any = None  # hpo.retry_of: a retry an orchestrator enqueued

    @property
    def outside(self) -> bool:
        """No orchestrator asked it (:func:`keys.asked_outside`)."""
        return keys.asked_outside({keys.HOST: self.host, keys.PID: self.pid,
                              keys.ORCHESTRATOR_PID: self.orchestrator_pid,
                              keys.RETRY_OF: self.retry_of}, self.heartbeat is not None)


def running_among(connection: Connection, trial_ids: Collection[int]) -> list[RunningTrialRow]:
    """Those of ``trial_ids`` that are RUNNING (by the primary key: no scan of the study)."""
    if not trial_ids:
        return []
    found = rows(connection, _RUNNING_AMONG_SQL.format(now=_now(connection)),
                 {"ids": sorted(int(i) for i in trial_ids)}, ["ids"])

    def decoded(value: Any) -> Any:
        return None if value is None else json.loads(value)

    return [RunningTrialRow(int(trial_id), to_datetime(start), to_datetime(beat), to_datetime(now),
                            decoded(host), decoded(pid), decoded(orchestrator), decoded(retry_of))
            for trial_id, start, beat, now, host, pid, orchestrator, retry_of in found]


def no_longer_running(connection: Connection, trial_ids: list[int]) -> set[int]:
    """Those of ``trial_ids`` that are not RUNNING any more (another orchestrator reaped
    them): one indexed read of a handful of rows, for every heartbeat round."""
    if not trial_ids:
        return set()
    return {int(tid) for (tid,) in rows(connection, _NO_LONGER_RUNNING_SQL, {"ids": trial_ids}, ["ids"])}


def max_completed_step(connection: Connection, study_id: int) -> int | None:
    """The last step any COMPLETE trial of the study reported."""
    value = scalar(connection, _MAX_COMPLETED_STEP_SQL, {"s": study_id})
    return None if value is None else int(value)
