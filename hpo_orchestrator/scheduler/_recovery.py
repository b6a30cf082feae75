"""Recovery of trials whose orchestrator is gone: heartbeats for our own RUNNING trials, and
reaping of everyone else's that stopped beating ('lost', retried when allowed).

Three ways a trial is found lost: Optuna's stale check (a heartbeat older than the grace
period), an orphan on this host (its recorded pid no longer exists: found at once after a
``kill -9`` of its orchestrator), and a trial that never beat (its orchestrator died between
ask() and the first heartbeat).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import optuna
import psutil
from optuna.trial import TrialState

from hpo_orchestrator.db import _run
from hpo_orchestrator.scheduler._outcome import retry_allowed
from hpo_orchestrator.scheduler._records import RunRecords

__all__ = ["Recovery"]


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

    def beat(self) -> None:
        """Every storage.heartbeat_interval_s: a heartbeat for each of our trials, then reap."""
        now = time.monotonic()
        if now - self._last_beat < self.interval_s:
            return
        self._last_beat = now
        for trial_id in self.own_trials():
            self.storage.record_heartbeat(trial_id)
        self.reap()

    def reap(self) -> None:
        """Fail RUNNING trials whose orchestrator stopped sending heartbeats ('lost').

        Mirrors optuna.storages.fail_stale_trials, but records why before the state changes.
        """
        study_id = self.records.study._study_id
        ours = self.own_trials()
        stale = {*self.storage._get_stale_trial_ids(study_id), *self._orphans_here(ours),
                 *self._never_beat(ours)}
        for trial_id in sorted(stale):
            frozen = self.storage.get_trial(trial_id)
            attempt = int(frozen.user_attrs.get("hpo.attempt", 1))
            retry = retry_allowed("lost", attempt, self.max_retries)
            attrs = {"hpo.fail_reason": "lost",
                     "hpo.error": "its orchestrator stopped sending heartbeats"}
            try:
                self.records.write_attrs(trial_id, frozen.number,
                                         {**attrs, "hpo.retried": True} if retry else attrs)
                self.storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another orchestrator reaped it first
            if retry:
                self.records.enqueue_retry(frozen.number, frozen.params, attempt, "lost")

    def _orphans_here(self, ours: set[int]) -> list[int]:
        """RUNNING trials started on this host by a process that no longer exists."""
        orphans = []
        with self.storage.engine.connect() as connection:
            running = _run.running_with_host_pid(connection, self.records.study._study_id)
        for trial_id, host, pid in running:
            if trial_id in ours or host != self.host:
                continue
            if isinstance(pid, int) and not psutil.pid_exists(pid):
                orphans.append(trial_id)
        return orphans

    def _never_beat(self, ours: set[int]) -> list[int]:
        """RUNNING trials without any heartbeat, started longer than the grace period ago
        (Optuna's stale check only looks at trials that have a heartbeat row)."""
        cutoff = datetime.now() - timedelta(seconds=self.grace_s)  # datetime_start is local time
        with self.storage.engine.connect() as connection:
            found = _run.never_beat(connection, self.records.study._study_id, cutoff)
        return [tid for tid in found if tid not in ours]
