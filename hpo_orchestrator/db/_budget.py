"""The statements behind the study's shared trial budget (hpo_orchestrator.scheduler._budget):
what counts against ``study.n_trials``, and the PostgreSQL lock every claimer takes."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._engine import ADVISORY_NAMESPACE

__all__ = ["count_claimed", "count_running", "lock_study_budget"]

# Not WAITING, and not a failed attempt that was retried (its retry counts instead).
_CLAIMED_SQL = (
    "SELECT COUNT(*) FROM trials t WHERE t.study_id = :s AND t.state <> 'WAITING' "
    "AND NOT EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id "
    "AND a.key = 'hpo.retried' AND a.value_json = 'true')")
_RUNNING_SQL = "SELECT COUNT(*) FROM trials WHERE study_id = :s AND state = 'RUNNING'"
_LOCK_SQL = "SELECT pg_advisory_xact_lock(:ns, :s)"


def count_claimed(connection: Connection, study_id: int) -> int:
    """Trials that count against the budget."""
    return int(connection.execute(text(_CLAIMED_SQL), {"s": study_id}).scalar() or 0)


def count_running(connection: Connection, study_id: int) -> int:
    """RUNNING trials of the study, whoever runs them."""
    return int(connection.execute(text(_RUNNING_SQL), {"s": study_id}).scalar() or 0)


def lock_study_budget(connection: Connection, study_id: int) -> None:
    """PostgreSQL only: a transaction-scoped advisory lock keyed by the study, held until the
    caller's transaction ends."""
    connection.execute(text(_LOCK_SQL), {"ns": ADVISORY_NAMESPACE, "s": study_id})
