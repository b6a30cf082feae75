"""Where the loop's trials come from: claims on the study-wide budget, asked of Optuna on
demand or ahead of a free slot (``scheduler.prefetch``), and where a retry of a trial that
ran out of GPU memory should go."""

from __future__ import annotations

import time

import optuna

from hpo_orchestrator.gpu import GpuBackend
from hpo_orchestrator.placement import SlotPool
from hpo_orchestrator.scheduler._budget import Budget
from hpo_orchestrator.scheduler._trial import Asked
from hpo_orchestrator.scheduler._writes import RunRecords

__all__ = ["Asking"]

_RECHECK_BUDGET_S = 1.0  # once spent, how often to look again (retries may be enqueued)


class Asking:
    def __init__(self, study: optuna.Study, storage: optuna.storages.RDBStorage, budget: Budget,
                 records: RunRecords, slots: SlotPool, backend: GpuBackend | None,
                 prefetch: int) -> None:
        self.study = study
        self.storage = storage
        self.budget = budget
        self.records = records
        self.slots = slots
        self.backend = backend
        self.prefetch_n = prefetch
        self.ready: list[Asked] = []  # asked ahead of a free slot
        self.exhausted_at: float | None = None  # when a claim last found the budget spent

    def spent_lately(self) -> bool:
        """A claim found the budget spent a moment ago: do not ask again yet."""
        return self.exhausted_at is not None \
            and time.monotonic() - self.exhausted_at < _RECHECK_BUDGET_S

    def claim(self, oom_retry: bool) -> Asked | None:
        """A new trial from the shared budget (retries, WAITING, are asked first)."""
        # Ours from the start (a heartbeat), and until its worker starts this process holds it:
        # a restart after kill -9 then finds it an orphan at once, not after the heartbeat
        # grace (hpo.orchestrator_pid). Written with a new trial's row, in its transaction.
        with self.records.mirror.starting(self.records.asked_attrs()) as created:
            trial = self.budget.claim(self.study.ask)
        if trial is None:
            self.exhausted_at = time.monotonic()
            return None
        self.exhausted_at = None
        if trial._trial_id not in created:  # ask() took a WAITING trial (a retry, an enqueued one)
            self.records.mirror.record_heartbeat(trial._trial_id)
            self.records.asked(trial)
        return Asked(trial, self.records.attempt_of(trial), oom_retry)

    def prefetch(self, stopping: bool) -> None:
        """Ask ahead (scheduler.prefetch trials) while every slot is busy, so that a slot that
        frees up gets its next trial at once instead of after Optuna's ask (10-30 ms of ORM
        work on the one loop that serves every slot). The sampler then decides a trial before
        the latest results are told, as with one more parallel trial.

        The caller leaves this out under study.timeout_s: a trial asked ahead when the limit
        passes would have to be failed unstarted (as on Ctrl-C); asked on demand, the limit
        leaves none behind."""
        while len(self.ready) < self.prefetch_n and not stopping and not self.spent_lately():
            asked = self.claim(self.next_is_oom_retry())
            if asked is None:
                return
            self.ready.append(asked)

    def study_done(self) -> bool:
        """Budget spent and no trial RUNNING anywhere: trials of a dead orchestrator are
        waited for until the heartbeat check fails them (and their retries have run)."""
        if self.exhausted_at is None:
            return False
        return self.budget.left() == 0 and self.budget.running() == 0

    def next_is_oom_retry(self) -> bool:
        if self.backend is None or not any(s.gpu for s in self.slots.slots):
            return False
        return self.records.next_is_oom_retry()

    def free_memory(self) -> dict[int, float] | None:
        """Free MiB per GPU, for placing a retry of a trial that ran out of memory."""
        if self.backend is None:
            return None
        free = {}
        for gpu in self.backend.gpus():
            sample = self.backend.sample(gpu.index)
            if sample is not None and sample.mem_used_mib is not None and gpu.memory_total_mib:
                free[gpu.index] = gpu.memory_total_mib - sample.mem_used_mib
        return free or None
