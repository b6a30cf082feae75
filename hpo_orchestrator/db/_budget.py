"""The statements behind the study's shared trial budget (hpo_orchestrator.scheduler._budget):
what counts against ``study.n_trials``, and the PostgreSQL lock every claimer takes."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._engine import ADVISORY_NAMESPACE
from hpo_orchestrator.db._study import state_name, to_datetime

__all__ = ["claimed_rows_after", "count_claimed", "count_claimed_upto", "count_running",
           "lock_study_budget", "settled_upto"]

# Not WAITING, and not a failed attempt that was retried (its retry counts instead).
_CLAIMED_SQL = (
    "SELECT COUNT(*) FROM trials t WHERE t.study_id = :s AND t.state <> 'WAITING' "
    "AND NOT EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id "
    "AND a.key = 'hpo.retried' AND a.value_json = 'true')")
_CLAIMED_UPTO_SQL = _CLAIMED_SQL + " AND t.trial_id <= :upto"
# The trials above a checkpoint, by a range on the primary key (``+``: not the study index).
_ROWS_AFTER_SQL = (
    "SELECT t.trial_id, t.state, t.datetime_complete, EXISTS (SELECT 1 FROM "
    "trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key = 'hpo.retried' "
    "AND a.value_json = 'true') FROM trials t WHERE t.trial_id > :after AND +t.study_id = :s")
# The first trial that may still change what it counts: unfinished, or finished so recently
# that its ``hpo.retried`` mark (written before its state) may still be on its way.
_UNSETTLED_SQL = (
    "SELECT MIN(trial_id) FROM trials WHERE study_id = :s AND (state IN ('RUNNING', 'WAITING') "
    "OR datetime_complete IS NULL OR datetime_complete > :since)")
_MAX_ID_SQL = "SELECT MAX(trial_id) FROM trials WHERE study_id = :s"
# Trials an orchestrator asked (db/_run.py asked_outside: the others are their maker's to finish)
_RUNNING_SQL = (
    "SELECT COUNT(*) FROM trials t WHERE t.study_id = :s AND t.state = 'RUNNING' AND ("
    "EXISTS (SELECT 1 FROM trial_heartbeats b WHERE b.trial_id = t.trial_id) OR EXISTS ("
    "SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key IN "
    "('hpo.host', 'hpo.pid', 'hpo.orchestrator_pid', 'hpo.retry_of')))")
_LOCK_SQL = "SELECT pg_advisory_xact_lock(:ns, :s)"


def count_claimed(connection: Connection, study_id: int) -> int:
    """Trials that count against the budget."""
    return int(connection.execute(text(_CLAIMED_SQL), {"s": study_id}).scalar() or 0)


def count_running(connection: Connection, study_id: int) -> int:
    """RUNNING trials of the study that an orchestrator asked, whichever runs them."""
    return int(connection.execute(text(_RUNNING_SQL), {"s": study_id}).scalar() or 0)


def lock_study_budget(connection: Connection, study_id: int) -> None:
    """PostgreSQL only: a transaction-scoped advisory lock keyed by the study, held until the
    caller's transaction ends."""
    connection.execute(text(_LOCK_SQL), {"ns": ADVISORY_NAMESPACE, "s": study_id})


def count_claimed_upto(connection: Connection, study_id: int, upto: int) -> int:
    """Trials up to id ``upto`` that count against the budget."""
    return int(connection.execute(text(_CLAIMED_UPTO_SQL), {"s": study_id, "upto": upto}).scalar()
               or 0)


def claimed_rows_after(connection: Connection, study_id: int,
                       after: int) -> list[tuple[int, str, datetime | None, bool]]:
    """(trial_id, state, datetime_complete, retried) of the study's trials above ``after``."""
    rows = connection.execute(text(_ROWS_AFTER_SQL), {"s": study_id, "after": after})
    return [(int(tid), state_name(state), to_datetime(done), bool(retried))
            for tid, state, done, retried in rows]


def settled_upto(connection: Connection, study_id: int, since: datetime) -> int:
    """The highest id below which every trial is finished before ``since`` (local time, as
    Optuna stores it): their contribution to the budget can no longer change."""
    first = connection.execute(text(_UNSETTLED_SQL), {"s": study_id, "since": since}).scalar()
    if first is not None:
        return int(first) - 1
    last = connection.execute(text(_MAX_ID_SQL), {"s": study_id}).scalar()
    return -1 if last is None else int(last)
