"""Recovery of trials whose orchestrator is gone: heartbeats for our own RUNNING trials, and
reaping of everyone else's that stopped beating ('lost', retried when allowed).

Three ways a trial is found lost: Optuna's stale check (a heartbeat older than the grace
period), an orphan on this host (the orchestrator that asked it no longer exists: found at
once after a ``kill -9``, trials asked ahead included), and a trial that never beat (its
orchestrator died between ask() and the first heartbeat).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import optuna
import psutil
from optuna.trial import FrozenTrial

from hpo_orchestrator import keys
from hpo_orchestrator.db import RunningTrialRow, running_among
from hpo_orchestrator.scheduler._writes import Retry, RunRecords, trial_params

__all__ = ["Recovery", "last_alive", "lost_attrs", "never_ran", "orphaned"]


class Recovery:
    """Heartbeats and reaping for one orchestrator. ``own_trials`` names the trials it holds
    RUNNING (on a slot or asked ahead): those are never reaped by it."""

    def __init__(self, storage: optuna.storages.RDBStorage, records: RunRecords, host: str,
                 own_trials: Callable[[], set[int]], interval_s: float, grace_s: float,
                 max_retries: int) -> None:
        self.storage = storage
        self.records = records
        self.host = host
        self.own_trials = own_trials
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.max_retries = max_retries
        self._last_beat = 0.0

    def beat(self) -> bool:
        """Every storage.heartbeat_interval_s: a heartbeat for each of our trials, then reap.
        True in a round that beat (the loop checks then that our trials are still ours)."""
        now = time.monotonic()
        if now - self._last_beat < self.interval_s:
            return False
        self._last_beat = now
        for trial_id in self.own_trials():
            self.records.mirror.record_heartbeat(trial_id)  # @retried
        self.reap()
        return True

    def reap(self) -> None:
        """Fail RUNNING trials whose orchestrator stopped sending heartbeats ('lost').

        Mirrors optuna.storages.fail_stale_trials, but records why, and enqueues the retry,
        in the transaction that changes the state. A trial no slot took (asked ahead) goes
        back to the queue as the WAITING trial it was (``never_ran``): no failure, no start.

        Only the study's unfinished trials are read (the run's mirror knows them, any
        process's, as of at most storage.refresh_s ago), so a round costs the same on a
        study of 100 trials or 100,000.
        """
        ours = self.own_trials()
        def read() -> list[RunningTrialRow]:
            candidates = self.records.mirror.unfinished_trial_ids(self.records.study._study_id)
            with self.storage.engine.connect() as connection:
                return running_among(connection, candidates)
        cutoff = datetime.now() - timedelta(seconds=self.grace_s)  # datetime_start is local time
        stale = [trial for trial in self.records.retrying.call(read)
                 if self._lost(trial, ours, cutoff)]
        for trial in sorted(stale, key=lambda t: t.trial_id):
            # the database's copy (the mirror's may be older), through storage trouble
            frozen = self.records.retrying.call(partial(self.storage.get_trial, trial.trial_id))
            if never_ran(frozen):  # asked ahead: it goes back to the queue, no failure
                self.records.requeue(trial.trial_id)
                continue
            attrs, retry = lost_attrs(frozen, self.max_retries)
            self.records.reap(trial.trial_id, frozen.number, attrs, retry, last_alive(trial))

    def _lost(self, trial: RunningTrialRow, ours: set[int], cutoff: datetime) -> bool:
        """Never a trial of ours: this run watches its process, and its heartbeat is old only
        when a write of it waited for a lock. Else Optuna's stale check (a heartbeat older
        than the grace period, by the database's clock), or an orphan on this host (the
        orchestrator that asked it no longer exists: found at once after a ``kill -9``,
        asked-ahead trials included; trials of an older version have only their child's
        pid), or a trial that never beat, started before ``cutoff``
        (Optuna's stale check only looks at trials that have a heartbeat)."""
        if trial.trial_id in ours:
            return False
        if trial.heartbeat is not None and trial.now is not None \
                and trial.now - trial.heartbeat > timedelta(seconds=self.grace_s):
            return True
        if trial.outside:  # no orchestrator asked it
            return False
        if trial.heartbeat is None and trial.started is not None and trial.started < cutoff:
            return True
        return orphaned(trial, self.host)


def orphaned(trial: RunningTrialRow, host: str) -> bool:
    """Was the RUNNING trial asked on ``host`` by an orchestrator that no longer exists (a
    ``kill -9``)? Such a trial is reaped at once, and retried where allowed."""
    if trial.outside or trial.host != host:
        return False
    owner = trial.orchestrator_pid if trial.orchestrator_pid is not None else trial.pid
    return isinstance(owner, int) and not _alive_since(owner, trial.started)


def never_ran(frozen: FrozenTrial) -> bool:
    """An orphan no slot took (no ``hpo.pid``, written when one does): the dead run had only
    asked it ahead. One already marked ``hpo.retried`` had its retry enqueued: it is failed
    as lost (its state only), so that its params do not run twice."""
    return keys.PID not in frozen.user_attrs and frozen.user_attrs.get(keys.RETRIED) is not True


def last_alive(trial: RunningTrialRow) -> datetime:
    """When a lost trial was last known to run, as its end (datetime_complete, local time):
    its last heartbeat, whose age the database's clock gives; the run's report writes stamp
    the heartbeat too (study/_storage.py ``flush``), so the end is never before its last
    stored report (with heartbeats every 10 s, trials that ran 3 s were stored at 0.0 and
    0.54 s). Ended at the reaping, a trial of 13 s lasted 69 s (its orchestrator killed, the
    next run started a minute later)."""
    now = datetime.now()
    if trial.heartbeat is None or trial.now is None:
        return now
    ended = now - max(trial.now - trial.heartbeat, timedelta(0))
    return max(ended, trial.started) if trial.started is not None else ended


MAX_LOST_RUNS = 3  # params lost this many times in a row are not run again


def lost_attrs(frozen: FrozenTrial, max_retries: int) -> tuple[dict[str, Any], Retry | None]:
    """What a reaped trial records, and its retry (None: its params do not run again).

    A lost trial's orchestrator died (a ``kill -9``, its host went down): not the objective's
    failure, so its retry keeps the attempt number, as an interrupted trial's does, and
    spends none of ``scheduler.max_retries``. Only params lost MAX_LOST_RUNS times in a row
    stop: a trial that kills its own orchestrator (or its host's memory) would be run again
    by every restart. A trial already marked ``hpo.retried`` has its retry enqueued (in the
    same transaction as the mark): its orchestrator died before telling it, so only the
    state changes.
    """
    if frozen.user_attrs.get(keys.RETRIED) is True:
        return {}, None
    attempt = int(frozen.user_attrs.get(keys.ATTEMPT, 1))
    ran = keys.PID in frozen.user_attrs  # written when a slot took it
    before = int(frozen.user_attrs.get(keys.LOST_RUNS, 0))
    lost_runs = before + 1 if ran else before
    attrs: dict[str, Any] = {
        keys.FAIL_REASON: "lost",
        keys.ERROR: "its orchestrator stopped sending heartbeats" if ran
        else "its orchestrator stopped before a slot took it"}
    if lost_runs >= MAX_LOST_RUNS:
        attrs[keys.ERROR] = (f"its orchestrator stopped sending heartbeats: these params were "
                             f"lost {lost_runs} times in a row, and do not run again (does the "
                             "trial stop its orchestrator, or exhaust the host's memory?)")
        return attrs, None
    return attrs, Retry(number=frozen.number, params=trial_params(frozen), reason="lost",
                        attempt=attempt, lost_runs=lost_runs)


def _alive_since(pid: int, started: datetime | None) -> bool:
    """Does ``pid`` still name the process that held the trial? A process created after the
    trial started is another one that got the pid."""
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return psutil.pid_exists(pid)
    return started is None or created <= started.timestamp() + 1.0  # local time, like Optuna's
