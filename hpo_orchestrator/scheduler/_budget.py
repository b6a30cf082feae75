"""The study's trial budget, shared by every orchestrator on the study (any host).

``study.n_trials`` counts the study's trials that are not WAITING, except failed attempts
that were retried (their retry counts instead). A claim counts them and asks for a trial
while holding a lock that every orchestrator takes for the same study, so together they start
exactly n_trials trials:

- PostgreSQL (several hosts): a transaction-scoped advisory lock keyed by the study id;
- sqlite (one host): an flock on a file beside the database (sqlite's own write lock cannot
  be held across Optuna's separate connection without deadlocking it);
- any other backend: no lock, best effort (documented).

Counting in the database instead of keeping a counter means nothing can drift: a claimer that
dies between its count and its ask leaves nothing behind.

Counting every trial costs O(study) per claim (0.26 s at 100,000 trials on the 2-core VM), so
the count is split at a checkpoint: below it every trial finished more than _SETTLE_S ago, and
a finished trial's contribution never changes (its state is final; ``hpo.retried`` is written
while it is RUNNING, just before its state), so that part is counted once and kept; above it the
few recent trials are counted on each claim by a range on the primary key. Still exact, still
in the database, whichever process wrote the trials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from hpo_orchestrator.db import (
    Retrying,
    RunningTrialRow,
    rows,
    running_among,
    scalar,
    state_name,
    to_datetime,
)
from hpo_orchestrator.db.connect import ADVISORY_NAMESPACE, file_lock, lock_file
from hpo_orchestrator.scheduler._race_hooks import budget_claim_started, budget_counted

if TYPE_CHECKING:
    from optuna.storages import RDBStorage
    from sqlalchemy.engine import Connection, Engine

    from hpo_orchestrator.db import Readable

__all__ = ["Budget", "Recoverable", "count_claimed"]

T = TypeVar("T")

_SETTLE_S = 10.0  # a retry mark lands before its trial finishes; this covers racing writers
_ADVANCE_AT = 64  # trials above the checkpoint before it moves up

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
# Trials an orchestrator asked (keys.asked_outside: the others are their maker's to finish)
_RUNNING_SQL = (
    "SELECT COUNT(*) FROM trials t WHERE t.study_id = :s AND t.state = 'RUNNING' AND ("
    "EXISTS (SELECT 1 FROM trial_heartbeats b WHERE b.trial_id = t.trial_id) OR EXISTS ("
    "SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key IN "
    "('hpo.host', 'hpo.pid', 'hpo.orchestrator_pid', 'hpo.retry_of')))")
_LOCK_SQL = "SELECT pg_advisory_xact_lock(:ns, :s)"


class Recoverable(NamedTuple):
    """What a restart's reaping takes out of the budget's count."""

    lost: int  # ran, failed as lost with a retry: their params run again ('recovering N')
    requeued: int  # asked ahead, no slot took them: WAITING again, no failure

    @property
    def total(self) -> int:
        return self.lost + self.requeued


def count_claimed(connection: Readable, study_id: int) -> int:
    """Trials that count against the budget."""
    return int(scalar(connection, _CLAIMED_SQL, {"s": study_id}) or 0)


def count_running(connection: Readable, study_id: int) -> int:
    """RUNNING trials of the study that an orchestrator asked, whichever runs them."""
    return int(scalar(connection, _RUNNING_SQL, {"s": study_id}) or 0)


def lock_study_budget(connection: Readable, study_id: int) -> None:
    """PostgreSQL only: a transaction-scoped advisory lock keyed by the study, held until the
    caller's transaction ends."""
    rows(connection, _LOCK_SQL, {"ns": ADVISORY_NAMESPACE, "s": study_id})


def count_claimed_upto(connection: Readable, study_id: int, upto: int) -> int:
    """Trials up to id ``upto`` that count against the budget."""
    return int(scalar(connection, _CLAIMED_UPTO_SQL, {"s": study_id, "upto": upto}) or 0)


def claimed_rows_after(connection: Readable, study_id: int,
                       after: int) -> list[tuple[int, str, datetime | None, bool]]:
    """(trial_id, state, datetime_complete, retried) of the study's trials above ``after``."""
    return [(int(tid), state_name(state), to_datetime(done), bool(retried))
            for tid, state, done, retried in rows(connection, _ROWS_AFTER_SQL,
                                                  {"s": study_id, "after": after})]


def settled_upto(connection: Readable, study_id: int, since: datetime) -> int:
    """The highest id below which every trial is finished before ``since`` (local time, as
    Optuna stores it): their contribution to the budget can no longer change."""
    first = scalar(connection, _UNSETTLED_SQL, {"s": study_id, "since": since})
    if first is not None:
        return int(first) - 1
    last = scalar(connection, _MAX_ID_SQL, {"s": study_id})
    return -1 if last is None else int(last)


class Budget:
    def __init__(self, engine: Engine, study_id: int, n_trials: int,
                 sqlite_file: Path | None, retrying: Retrying | None = None,
                 unfinished: Callable[[], set[int]] | None = None) -> None:
        self.engine = engine
        # the study's RUNNING and WAITING trial ids, as the run's mirror knows them: running()
        # then reads those few by id instead of counting over the study
        self.unfinished = unfinished
        self.study_id = study_id
        self.n_trials = n_trials
        self._lock_file = None if sqlite_file is None else lock_file(sqlite_file)
        # each step again through transient storage trouble (db._retry); none: no retries
        self.retrying = retrying or Retrying(0.0, engine.dialect.name)
        self._upto: int | None = None  # the checkpoint: trials up to this id are settled
        self._base = 0  # what they count against the budget

    def claimed(self, connection: Connection | None = None) -> int:
        if connection is None:
            def read() -> int:
                with self.engine.connect() as fresh:
                    return self.claimed(fresh)
            return self.retrying.call(read)
        since = datetime.now() - timedelta(seconds=_SETTLE_S)  # Optuna stores local time
        if self._upto is None:  # both read before either is kept: a failed read may be retried
            upto = settled_upto(connection, self.study_id, since)
            self._base = count_claimed_upto(connection, self.study_id, upto)
            self._upto = upto
        after = claimed_rows_after(connection, self.study_id, self._upto)
        counted = self._base + sum(1 for _, state, _, retried in after
                                   if state != "WAITING" and not retried)
        if len(after) >= _ADVANCE_AT:
            self._advance(after, since)
        return counted

    def _advance(self, rows: list[tuple[int, str, datetime | None, bool]], since: datetime) -> None:
        """Move the checkpoint over the settled prefix of ``rows`` (sorted here by id)."""
        for trial_id, state, done, retried in sorted(rows):
            if state in ("RUNNING", "WAITING") or done is None or done > since:
                return
            self._upto = trial_id
            self._base += 0 if retried else 1

    def left(self) -> int:
        return max(0, self.n_trials - self.claimed())

    def running(self) -> int:
        """RUNNING trials of the study that an orchestrator asked, whichever runs them (one
        made outside any run, by ``optuna ask``, is its maker's to finish: not waited for)."""
        def read() -> int:
            candidates = self.unfinished() if self.unfinished is not None else None
            with self.engine.connect() as connection:
                if candidates is None:
                    return count_running(connection, self.study_id)
                return sum(not row.outside for row in running_among(connection, candidates))
        return self.retrying.call(read)

    def _running_rows(self) -> list[RunningTrialRow]:
        def read() -> list[RunningTrialRow]:
            candidates = self.unfinished() if self.unfinished is not None else set()
            with self.engine.connect() as connection:
                return running_among(connection, candidates)
        return self.retrying.call(read)

    def orphans(self, host: str) -> list[int]:
        """The ids of the RUNNING trials a stopped orchestrator on ``host`` left (a ``kill
        -9``), which this run reaps at once (scheduler/_recovery.py)."""
        # The reaping rules import Optuna, which the first wave starts before (this module is
        # on its way): imported when a run asks.
        from hpo_orchestrator.scheduler._recovery import orphaned

        return [row.trial_id for row in self._running_rows() if orphaned(row, host)]

    def running_elsewhere(self, host: str) -> int:
        """RUNNING trials that count against the budget and that this run does not reap: those
        of a live orchestrator (any host) and those made outside any run (``optuna ask``).
        Claimed, not done: a run's start tells them apart from the finished ones."""
        from hpo_orchestrator.scheduler._recovery import orphaned  # as orphans()

        return sum(not orphaned(row, host) for row in self._running_rows())

    def recoverable(self, storage: RDBStorage, host: str, max_retries: int) -> Recoverable:
        """Of the orphans, those that leave the count once a run reaps them: reaped with a
        retry (lost_attrs), and those asked ahead that go back to the queue (never_ran); not
        one whose retries are spent, nor one already marked retried (not counted now)."""
        from hpo_orchestrator.scheduler._recovery import lost_attrs, never_ran  # as orphans()

        lost = requeued = 0
        for trial_id in self.orphans(host):
            frozen = self.retrying.call(partial(storage.get_trial, trial_id))
            if never_ran(frozen):
                requeued += 1
            elif lost_attrs(frozen, max_retries)[1] is not None:
                lost += 1
        return Recoverable(lost, requeued)

    def claim(self, ask: Callable[[], T]) -> T | None:
        """``ask()`` if the budget has room (under the study's lock), else None."""
        asked: list[T] = []

        def step() -> T | None:
            if asked:  # an earlier try's ask went through and the lock's end failed (a
                return asked[0]  # terminated connection): asked again, its trial was lost
            budget_claim_started()  # no-ops unless a test forces a race (scheduler/_race_hooks.py)
            with self._locked() as connection:
                if self.claimed(connection) >= self.n_trials:
                    return None
                budget_counted()
                asked.append(ask())
                return asked[0]
        return self.retrying.call(step)

    @contextmanager
    def _locked(self) -> Iterator[Connection | None]:
        if self._lock_file is not None:
            with file_lock(self._lock_file):
                yield None
        elif self.engine.dialect.name == "postgresql":
            with self.engine.connect() as connection, connection.begin():
                lock_study_budget(connection, self.study_id)
                yield connection
        else:
            yield None
