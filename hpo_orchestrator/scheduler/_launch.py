"""Launching trials: the first wave of reuse workers, filling free slots (a trial asked
ahead, or a new claim on the budget), spawning a trial on its slot, and the GPU packer's
levels. A part of the Orchestrator (scheduler/_orchestrator.py), kept apart for its size:
the attributes below are the orchestrator's.
"""

from __future__ import annotations

import select
import time
from datetime import datetime
from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpo_orchestrator.config import Config
from hpo_orchestrator.scheduler import _calls
from hpo_orchestrator.scheduler._asking import Asking
from hpo_orchestrator.scheduler._budget import Budget
from hpo_orchestrator.scheduler._deadlines import StudyDeadline
from hpo_orchestrator.scheduler._logs import take_startup_log, trial_log_path
from hpo_orchestrator.scheduler._packer import Packer
from hpo_orchestrator.scheduler._process import cgroup_oom_kills
from hpo_orchestrator.scheduler._records import RunRecords
from hpo_orchestrator.scheduler._slots import Slot, SlotPool
from hpo_orchestrator.scheduler._trial import Asked, Reporter, RunningTrial
from hpo_orchestrator.scheduler._workers import Workers
from hpo_orchestrator.telemetry import TelemetrySampler
from hpo_orchestrator.worker import Job

__all__ = ["Launching"]

_POLL_S = 0.1
# Reuse mode: how long the run waits for its first workers' start-up (imports, the
# objective's setup) before it asks their trials anyway (a setup that hangs then shows as a
# running trial, whose scheduler.trial_timeout_s applies, as before there was a wait).
_FIRST_WAVE_WAIT_S = 30.0


class Launching:
    config: Config
    study: optuna.Study
    budget: Budget
    slots: SlotPool
    threads: int
    reporter: Reporter
    sampler: TelemetrySampler | None
    running: dict[int, RunningTrial]
    reuse: bool
    log_dir: Path
    workers: Workers
    deadline: StudyDeadline
    records: RunRecords
    asking: Asking
    packer: Packer | None
    _stopping: bool
    _signals: int
    _directions: tuple[str, ...]

    def _answer_calls(self) -> None:
        """Answer the calls (a ``suggest``, a ``report``) that already came in, between the
        loop's storage work for other trials: when several trials end together, each new
        trial's first call would otherwise wait for every other trial's start and end to be
        written (about 10 ms each on the 2-core VM: docs/BENCHMARKS.md "Costs the code
        cites")."""
        _calls.serve(list(self.running.values()), 0.0, self.sampler)

    # --- launching -------------------------------------------------------------------------

    def _start_first_wave(self) -> None:
        """Reuse mode: the first slots' workers start up before any trial is asked, so that a
        trial's RUNNING time in the study is its own, as under Optuna's study.optimize (whose
        processes ask after their imports), and not its worker's imports and setup (0.9 s
        for a trivial objective on the 2-core VM, 10-20 s on gpu_mix: docs/BENCHMARKS.md
        "Costs the code cites").
        Waits until they are ready, at most _FIRST_WAVE_WAIT_S; a worker that dies meanwhile
        is replaced by a fresh one at its trial (whose failure then says why). A wave started
        before the storage (the runner's, scheduler/_first_wave.py) is only waited for, less
        the workers the study's budget leaves nothing for."""
        if not self.reuse or self._signals:
            return
        wanted = min(self.slots.concurrency, self.budget.left())
        for slot_id in sorted(self.workers.idle)[wanted:]:  # started early, beyond the budget
            self.workers.retire(self.workers.idle.pop(slot_id), slot_id)
        # the rest of the wave (all of it, unless started early) on slots free by now
        threads = self.threads if self.packer is None else self.packer.threads_for_next(())
        self.workers.start_first_wave(wanted, threads, self.config.objective)
        # no longer than a trial may take: a setup past it fails the first trial at once
        timeout_s = self.config.scheduler.trial_timeout_s
        until = time.monotonic() + min(_FIRST_WAVE_WAIT_S, timeout_s or _FIRST_WAVE_WAIT_S)
        while (starting := self.workers.starting()) and time.monotonic() < until \
                and not self._signals and not self.deadline.check((), 0.0):
            select.select([w.connection for w in starting], [], [], _POLL_S)
            self.reporter.setting_up(len(starting), time.monotonic() - starting[0].born)

    def _launch_ready(self, claim: bool = True) -> None:
        """Fill free slots (a slot first: a lease on this host; then a trial: a pre-asked one,
        or a new claim on the budget), then ask ahead for the next free slot.

        ``claim=False``: only hand out trials already asked (a trial just ended and is not
        told yet: a new ask should see its result).
        """
        ready = self.asking.ready
        while self.slots.has_free() and not self._stopping and (claim or ready):
            if not ready and self.asking.spent_lately():
                return  # spent a moment ago; a retry may appear later
            oom_retry = ready[0].oom_retry if ready else self.asking.next_is_oom_retry()
            slot = self.slots.acquire(self.asking.free_memory() if oom_retry else None)
            if slot is None:
                return  # every slot is taken (here or by another orchestrator on this host)
            try:
                asked = ready.pop(0) if ready else self.asking.claim(oom_retry)
                if asked is None:
                    self.slots.release(slot, keep_lease=slot.id in self.workers.idle)
                    self.workers.retire_idle()  # free their GPU memory and slots for other studies
                    return
                self._spawn(asked, slot)
            except BaseException:
                self.slots.release(slot, keep_lease=slot.id in self.workers.idle)
                raise
            self._answer_calls()
        if claim and self.deadline.at is None:  # not under study.timeout_s (Asking.prefetch)
            self.asking.prefetch(self._stopping)

    def _spawn(self, asked: Asked, slot: Slot) -> None:
        trial = asked.trial
        log_path = trial_log_path(self.log_dir, trial.number)
        if self.packer is not None:  # auto: the cores the running trials leave (_packer.py)
            self.threads = self.packer.threads_for_next(self.running.values())
        try:
            worker = self.workers.for_trial(slot, trial.number, asked.attempt, self.threads,
                                            log_path)
        except OSError:
            raise  # our file (its log), not the trial's doing: run() leaves it for recovery
        except BaseException:
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        worker.trials += 1
        # A first-wave worker whose start-up outlasted the wait: the trial's clock (its timeout,
        # its duration) starts with the worker, setup included, as in a worker started for it;
        # what the start-up printed so far becomes the start of the trial's log.
        in_setup = worker.starting and worker.trials == 1
        if in_setup and self.log_dir is not None:
            take_startup_log(self.log_dir, slot.id, log_path, trial.number)
        rt = RunningTrial(trial=trial, slot=slot, worker=worker, attempt=asked.attempt,
                          spawned_at=worker.born if in_setup else time.monotonic(),
                          spawned_epoch=worker.born_epoch if in_setup else time.time(),
                          oom_kills_at_spawn=cgroup_oom_kills(), log_path=log_path,
                          artifact_store=self.config.artifacts.store, threads=self.threads,
                          in_setup=in_setup)
        self.running[slot.id] = rt
        self.slots.describe(slot, study=self.study.study_name, trial=trial.number,
                            trial_pid=worker.process.pid)
        if self.sampler is not None:
            self.sampler.watch(slot.id, trial._trial_id, worker.process.pid,
                               slot.gpu.index if slot.gpu else None,
                               fresh=worker.trials == 1 and not worker.prepared)
        # The job first, the records after: the worker starts while we write. A child that
        # died at birth (killed from outside) is classified once it is reaped.
        rt.connection.send(Job(trial_number=trial.number, objective=self.config.objective,
                               attempt=asked.attempt, reuse=self.reuse,
                               log_path=str(log_path), artifact_store=rt.artifact_store,
                               num_threads=self.threads, collect=tuple(worker.killed),
                               study_name=self.study.study_name, directions=self._directions,
                               # as records.trial_started stores it (a trial asked ahead
                               # starts when spawned)
                               datetime_start=datetime.fromtimestamp(rt.spawned_epoch)))
        try:
            self.records.trial_started(rt, self.threads, self.config.scheduler.worker_mode)
        except optuna.exceptions.UpdateFinishedTrialError:
            rt.reaped = True  # asked ahead, then reaped while we were stopped: stop_faulty
        self.reporter.started(rt)

    def _pack(self) -> None:
        """scheduler.trials_per_gpu=auto (scheduler/_packer.py): when a GPU's level changes,
        new workers get the cores re-divided, and idle workers above the level go. In reuse
        mode each GPU keeps a spare worker, started up, for the place above its level while
        the study has trials left (scheduler.spare_workers, scheduler/_workers.py)."""
        if self.packer is None or not self.slots.auto:
            return
        self.packer.tick(self.running.values())
        for text in self.packer.take_notes():
            self.reporter.note(text)
        self.workers.retire_over_levels()
        if self.reuse and self.config.scheduler.spare_workers and not self._stopping \
                and self.asking.exhausted_at is None:
            self.workers.keep_spares(self.packer.workers_wanted(), self.threads,
                                     self.config.objective)

