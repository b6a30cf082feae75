"""The orchestrator: the one process per host that talks to the storage.

Data flow per trial::

    study.ask() -> free slot -> child spawned with its env fixed (GPU pinned, threads set)
      child: suggest/report/should_prune/set_user_attr -> pipe -> real optuna.Trial here
      child: result (value / pruned / error) or death -> classified -> study.tell()

This module is the loop and its recipe; the parts live beside it: the model (_trial), child
processes (_process), the pipe (_channel), outcome rules (_outcome), storage writes
(_records), heartbeats and reaping (_recovery), and pruner.min_resource=auto (pruning/_auto).

Lifecycle: ``run()`` returns an exit code (0 done, 130 stopped by SIGINT/SIGTERM). Whatever
happens, no trial this orchestrator started is left RUNNING: the ``finally`` path kills
remaining children and fails their trials as ``interrupted``.
"""

from __future__ import annotations

import signal
import socket
import sqlite3
import time
from types import FrameType

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from hpo_orchestrator.config import Config
from hpo_orchestrator.db import StorageUnavailable, first_line, retrying_of, trouble_of
from hpo_orchestrator.gpu import GpuBackend
from hpo_orchestrator.gpu._opencl import nvidia_icd_env
from hpo_orchestrator.pruning._auto import AutoPruner
from hpo_orchestrator.scheduler import _channel, _outcome
from hpo_orchestrator.scheduler._budget import Budget
from hpo_orchestrator.scheduler._deadlines import LoopClock, enforce_deadlines, stop_faulty
from hpo_orchestrator.scheduler._failures import FailurePolicy, Halt
from hpo_orchestrator.scheduler._logs import (
    TRACEBACK_CAP,
    append_traceback,
    cap_log,
    ensure_run_dir,
    run_dir,
    trial_log_path,
    user_frames,
)
from hpo_orchestrator.scheduler._packer import Packer
from hpo_orchestrator.scheduler._process import (
    cgroup_oom_kills,
    log_tail,
    retire_worker,
    signal_tree,
    start_worker,
)
from hpo_orchestrator.scheduler._records import RunRecords
from hpo_orchestrator.scheduler._recovery import Recovery
from hpo_orchestrator.scheduler._slots import Slot, SlotPool
from hpo_orchestrator.scheduler._tree import ProcessTrees, become_subreaper, restore_subreaper
from hpo_orchestrator.scheduler._trial import Asked, FinishedTrial, Reporter, RunningTrial, Worker
from hpo_orchestrator.telemetry import TelemetryRetention, TelemetrySampler
from hpo_orchestrator.worker import Job
from hpo_orchestrator.worker._env import ChildEnv

__all__ = ["Orchestrator"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
_POLL_S = 0.1
_LOG_CHECK_S = 2.0  # how often running trials' logs are checked against their size cap
# What the storage raises when it cannot write: Optuna's wrapper for failed commits,
# SQLAlchemy's errors (which Optuna lets through elsewhere) and the sqlite driver's own.
_STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, SQLAlchemyError, sqlite3.Error,
                   StorageUnavailable)
_RECHECK_BUDGET_S = 1.0  # once spent, how often to look again (retries may be enqueued)


class Orchestrator:
    def __init__(self, config: Config, study: optuna.Study, storage: optuna.storages.RDBStorage,
                 budget: Budget, slots: SlotPool, threads: int, reporter: Reporter,
                 sampler: TelemetrySampler | None = None, backend: GpuBackend | None = None,
                 host: str | None = None) -> None:
        self.config = config
        self.study = study
        self.storage = storage
        self.budget = budget
        self.slots = slots
        self.threads = threads
        self.reporter = reporter
        self.sampler = sampler
        self.backend = backend
        self.host = host or config.scheduler.host or socket.gethostname()
        self.running: dict[int, RunningTrial] = {}  # slot id -> trial
        self.reuse = config.scheduler.worker_mode == "reuse"
        self.idle: dict[int, Worker] = {}  # slot id -> a reuse worker waiting for its next trial
        self.ready: list[Asked] = []  # asked ahead of a free slot
        self._stopping = False  # shutting down: nothing new is started
        self._signals = 0
        self._exhausted_at: float | None = None  # when a claim last found the budget spent
        self.timed_out = False  # study.timeout_s passed: nothing new starts
        self._deadline: float | None = None
        self.clock = LoopClock(_POLL_S)  # the loop's pauses do not count against trials
        self._icd_env = nvidia_icd_env()
        self.records = RunRecords(storage, study, self.host, sampler,
                                  config.telemetry.compute_phases)
        self.recovery = Recovery(storage, self.records, self.host, self._own_trial_ids,
                                 config.storage.heartbeat_interval_s, config.storage.grace_s,
                                 config.scheduler.max_retries)
        self.auto = AutoPruner.for_config(study, config.pruner)  # pruner.min_resource=auto
        self.log_dir = run_dir(config.storage.url, study.study_name, config.scheduler.log_dir)
        self._log_cap = int(config.scheduler.log_max_mib * 2**20)
        self._logs_checked = 0.0
        self.failures = FailurePolicy(config.study.fail_fast, config.study.max_failures)
        self.halted: Halt | None = None  # the failure policy stopped the run (exit 1)
        # scheduler.trials_per_gpu=auto (and the study attr hpo.packing.<host> on GPU hosts)
        self.packer = Packer(config, slots, sampler, study, self.host) if slots.limits else None
        self.retention = TelemetryRetention(storage.engine, study._study_id, self.host,
                                            config.telemetry.keep_full_s,
                                            config.telemetry.max_rows_per_trial) \
            if sampler is not None else None  # old trials' samples averaged down (db/_retention)
        self.trees = ProcessTrees()  # what the trials' processes started (docs: README)

    # --- lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        """Run until n_trials are claimed and finished: 0, or 130 after SIGINT/SIGTERM.

        Raises RuntimeFailure (exit 1) when the storage stops accepting writes (disk full,
        read-only, server gone), after stopping every child; what was told before stays.
        """
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failure: BaseException | None = None
        subreaper = become_subreaper()  # orphans of the trials' processes come to us
        try:
            ensure_run_dir(self.log_dir)
            self.recovery.reap()
            self.records.record_devices([s.gpu for s in self.slots.slots if s.gpu is not None])
            if self.auto is not None:
                self.auto.seed(self.storage.engine)
            if self.sampler is not None:
                self.sampler.start()
            if self.config.study.timeout_s is not None:
                self._deadline = time.monotonic() + self.config.study.timeout_s
            while True:
                self._check_study_deadline()
                if not self._signals and self.halted is None:
                    self._launch_ready()
                # right after the launch: a tick between a trial's end and the refill of its
                # place would read a busy GPU as idle (then its level never grows)
                self._pack()
                if not self.running and (self._signals or self.halted or self.timed_out
                                         or self._study_done()):
                    break
                _channel.serve(list(self.running.values()), _POLL_S, self.sampler)
                stop_faulty(self.running.values(), self.config.scheduler.kill_grace_s)
                for rt in self._ended():
                    self._finish(rt)
                self.reporter.tick(list(self.running.values()))
                self.clock.discount_stall(self.running.values())
                enforce_deadlines(self.running.values(), self.config.scheduler.trial_timeout_s,
                                  self.config.scheduler.kill_grace_s)
                self._cap_logs()
                self.recovery.beat()
                self.trees.scan(self._worker_pids())
                self.records.flush_telemetry()
                if self.retention is not None:
                    self.retention.maybe_run()
        except _STORAGE_ERRORS as exc:
            failure = exc
        finally:
            self._stop_all(storage_failed=failure is not None)
            if self.packer is not None and failure is None:
                self.packer.close()
            self.trees.sweep_all()
            restore_subreaper(subreaper)
            if self.sampler is not None:
                self.sampler.stop()
                if failure is None:
                    self.records.flush_telemetry(force=True)
                    if self.retention is not None:
                        self.retention.maybe_run(force=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if isinstance(failure, StorageUnavailable):
            raise failure
        if failure is not None:  # a step that is not retried: named the same way
            cause = trouble_of(failure) or "unknown"
            raise StorageUnavailable(cause, first_line(failure), None) from failure
        if self._signals:
            return EXIT_INTERRUPTED
        self.halted = self.halted or self.failures.at_end()
        return EXIT_FAILED if self.halted else EXIT_OK

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        self._interrupt_running()
        if self._signals > 1:  # a second Ctrl-C: no more grace
            for rt in self.running.values():
                signal_tree(rt.process.pid, signal.SIGKILL)
            retrying_of(self.storage).give_up()  # nor waiting for the storage to come back

    def _halt(self, halt: Halt) -> None:
        """The failure policy says stop: nothing new starts, running trials are stopped as on
        Ctrl-C (FAIL, interrupted: the same command resumes), and run() returns 1."""
        self.halted = halt
        self._interrupt_running()

    def _interrupt_running(self) -> None:
        """Start nothing new; SIGTERM each running trial not yet stopped (FAIL, interrupted),
        SIGKILL after scheduler.kill_grace_s (enforced by the loop's deadlines)."""
        self._stopping = True
        now = time.monotonic()
        for rt in self.running.values():
            if rt.stop_reason is None:
                rt.stop_reason = "interrupted"
                signal_tree(rt.process.pid, signal.SIGTERM)
                rt.kill_at = now + self.config.scheduler.kill_grace_s

    # --- launching -------------------------------------------------------------------------

    def _launch_ready(self, claim: bool = True) -> None:
        """Fill free slots (a slot first: a lease on this host; then a trial: a pre-asked one,
        or a new claim on the budget), then ask ahead for the next free slot.

        ``claim=False``: only hand out trials already asked (a trial just ended and is not
        told yet: a new ask should see its result).
        """
        while self.slots.has_free() and not self._stopping and (claim or self.ready):
            now = time.monotonic()
            if not self.ready and self._exhausted_at is not None \
                    and now - self._exhausted_at < _RECHECK_BUDGET_S:
                return  # spent a moment ago; a retry may appear later
            oom_retry = self.ready[0].oom_retry if self.ready else self._next_is_oom_retry()
            slot = self.slots.acquire(self._free_memory() if oom_retry else None)
            if slot is None:
                return  # every slot is taken (here or by another orchestrator on this host)
            try:
                asked = self.ready.pop(0) if self.ready else self._claim(oom_retry)
                if asked is None:
                    self.slots.release(slot, keep_lease=slot.id in self.idle)
                    self._retire_idle()  # free their GPU memory and slots for other studies
                    return
                self._spawn(asked, slot)
            except BaseException:
                self.slots.release(slot, keep_lease=slot.id in self.idle)
                raise
        if claim:
            self._prefetch()

    def _claim(self, oom_retry: bool) -> Asked | None:
        """A new trial from the shared budget (retries, WAITING, are asked first)."""
        trial = self.budget.claim(self.study.ask)
        if trial is None:
            self._exhausted_at = time.monotonic()
            return None
        self._exhausted_at = None
        self.storage.record_heartbeat(trial._trial_id)  # ours from the start
        # Until its worker starts, this process holds it: a restart after kill -9 then finds
        # it an orphan at once, not after the heartbeat grace (hpo.orchestrator_pid).
        self.records.asked(trial)
        return Asked(trial, self.records.attempt_of(trial), oom_retry)

    def _prefetch(self) -> None:
        """Ask ahead (scheduler.prefetch trials) while every slot is busy, so that a slot that
        frees up gets its next trial at once instead of after Optuna's ask (10-30 ms of ORM
        work on the one loop that serves every slot). The sampler then decides a trial before
        the latest results are told, as with one more parallel trial.

        Not under study.timeout_s: a trial asked ahead when the limit passes would have to be
        failed unstarted (as on Ctrl-C); asked on demand, the limit leaves none behind."""
        if self._deadline is not None:
            return
        now = time.monotonic()
        while len(self.ready) < self.config.scheduler.prefetch and not self._stopping \
                and (self._exhausted_at is None or now - self._exhausted_at >= _RECHECK_BUDGET_S):
            asked = self._claim(self._next_is_oom_retry())
            if asked is None:
                return
            self.ready.append(asked)

    def _study_done(self) -> bool:
        """Budget spent and no trial RUNNING anywhere: trials of a dead orchestrator are
        waited for until the heartbeat check fails them (and their retries have run)."""
        if self._exhausted_at is None:
            return False
        return self.budget.left() == 0 and self.budget.running() == 0

    def _next_is_oom_retry(self) -> bool:
        if self.backend is None or not any(s.gpu for s in self.slots.slots):
            return False
        return self.records.next_is_oom_retry()

    def _free_memory(self) -> dict[int, float] | None:
        """Free MiB per GPU, for placing a retry of a trial that ran out of memory."""
        if self.backend is None:
            return None
        free = {}
        for gpu in self.backend.gpus():
            sample = self.backend.sample(gpu.index)
            if sample is not None and sample.mem_used_mib is not None and gpu.memory_total_mib:
                free[gpu.index] = gpu.memory_total_mib - sample.mem_used_mib
        return free or None

    def _spawn(self, asked: Asked, slot: Slot) -> None:
        trial = asked.trial
        worker = self.idle.pop(slot.id, None)
        log_path = trial_log_path(self.log_dir, trial.number)
        if worker is not None and (worker.process.poll() is not None
                                   or worker.connection.pending()):
            # Died while idle (killed from outside), or wrote after its trial ended (a thread
            # of the objective that lived on): the next trial gets a fresh process.
            self._retire(worker, slot.id, keep_lease=True)
            worker = None
        if self.packer is not None:  # auto: the cores the running trials leave (_packer.py)
            self.threads = self.packer.threads_for_next(self.running.values())
        try:
            if worker is None:
                child = ChildEnv(trial_number=trial.number, attempt=asked.attempt, slot=slot.id,
                                 gpu_index=slot.gpu.index if slot.gpu else None,
                                 gpu_uuid=slot.gpu.uuid if slot.gpu else None,
                                 cuda_visible_devices=slot.cuda_visible_devices,
                                 num_threads=self.threads)
                worker = start_worker(child, self._icd_env if slot.gpu is not None else {}, slot.id,
                                      log_path)
        except BaseException:
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        worker.trials += 1
        rt = RunningTrial(trial=trial, slot=slot, worker=worker, attempt=asked.attempt,
                          spawned_at=time.monotonic(), spawned_epoch=time.time(),
                          oom_kills_at_spawn=cgroup_oom_kills(), log_path=log_path,
                          threads=self.threads)
        self.running[slot.id] = rt
        self.slots.describe(slot, study=self.study.study_name, trial=trial.number,
                            trial_pid=worker.process.pid)
        if self.sampler is not None:
            self.sampler.watch(slot.id, trial._trial_id, worker.process.pid,
                               slot.gpu.index if slot.gpu else None, fresh=worker.trials == 1)
        # The job first, the records after: the worker starts while we write. A child that
        # died at birth (killed from outside) is classified once it is reaped.
        rt.connection.send(Job(trial_number=trial.number, objective=self.config.objective,
                               attempt=asked.attempt, reuse=self.reuse,
                               log_path=str(log_path), num_threads=self.threads))
        try:
            self.records.trial_started(rt, self.threads, self.config.scheduler.worker_mode)
        except optuna.exceptions.UpdateFinishedTrialError:
            rt.reaped = True  # asked ahead, then reaped while we were stopped: stop_faulty
        self.reporter.started(rt)

    def _pack(self) -> None:
        """scheduler.trials_per_gpu=auto (scheduler/_packer.py): when a GPU's level changes,
        new workers get the cores re-divided; idle workers above a GPU's level go (they hold
        GPU memory that its running trials may need)."""
        if self.packer is None or not self.slots.auto:
            return
        self.packer.tick(self.running.values())
        for slot_id, worker in list(self.idle.items()):
            gpu = self.slots.slots[slot_id].gpu
            if gpu is None:
                continue
            idle_here = sum(1 for i in self.idle if self.slots.slots[i].gpu == gpu)
            if self.slots.busy_on(gpu.index) + idle_here > self.slots.limits[gpu.index]:
                del self.idle[slot_id]
                self._retire(worker, slot_id)

    def _retire_idle(self) -> None:
        for slot_id, worker in list(self.idle.items()):
            del self.idle[slot_id]
            self._retire(worker, slot_id)

    def _retire(self, worker: Worker, slot_id: int, keep_lease: bool = False) -> None:
        """An idle reuse worker holds its slot's host-wide lease (its process holds GPU
        memory); retiring it gives the lease back, unless a trial is about to take the slot."""
        self.trees.scan(self._worker_pids(), force=True)  # its tree, before it comes apart
        retire_worker(worker, self.config.scheduler.kill_grace_s)
        self.trees.sweep(slot_id)
        if not keep_lease:
            self.slots.drop_lease(slot_id)

    # --- finishing -------------------------------------------------------------------------

    def _ended(self) -> list[RunningTrial]:
        """Trials whose process exited (their last messages read), and in reuse mode those
        whose result is in (the process lives on)."""
        ended = []
        for rt in list(self.running.values()):
            if rt.process.poll() is not None:
                _channel.drain(rt, self.sampler)
                ended.append(rt)
            elif self.reuse and rt.outcome is not None:
                ended.append(rt)
        return ended

    def _finish(self, rt: RunningTrial) -> None:
        """Free the trial's slot, hand it to a trial asked ahead, then record the end (the
        writes take 20-40 ms that the slot need not wait for)."""
        verdict, measured, ended_at = self._release(rt)
        if self.ready:
            self._launch_ready(claim=False)
        self._record(rt, verdict, measured, ended_at)

    def _release(self, rt: RunningTrial) -> tuple[_outcome.Verdict, dict[str, object], float]:
        """Classify the trial and take it off its slot; its worker stays for the slot's next
        trial (reuse mode, after a success) or is retired."""
        verdict = _outcome.classify(
            stop_reason=rt.stop_reason, outcome=rt.outcome, returncode=rt.process.returncode,
            timeout_s=self.config.scheduler.trial_timeout_s,
            oom_killed=lambda: _oom_killed_since(rt.oom_kills_at_spawn),
            log_tail=lambda: log_tail(rt.log_path) if rt.log_path else "",
            protocol_error=rt.protocol_error)
        ended_at = time.time()
        if rt.process.poll() is not None:
            signal_tree(rt.process.pid, signal.SIGKILL)  # leftovers in its group, if any
        measured = self.records.measure(rt)
        traceback = user_frames(rt.outcome.traceback) \
            if rt.outcome is not None and rt.outcome.traceback else None
        if verdict.state == TrialState.FAIL and traceback:
            measured["hpo.traceback"] = traceback[-TRACEBACK_CAP:]
            if rt.log_path is not None:
                append_traceback(rt.log_path, traceback)
        del self.running[rt.slot.id]
        if self.packer is not None:  # before the slot is handed on: an OOM lowers its GPU's level
            self.packer.trial_ended(rt, verdict.fail_reason, measured)
        alive = rt.process.poll() is None and rt.stop_reason is None  # not one we signalled
        if _outcome.keep_worker(reuse=self.reuse, alive=alive,
                                connection_open=rt.connection_open, stopping=bool(self._signals),
                                state=verdict.state, trials_run=rt.worker.trials,
                                max_trials=self.config.scheduler.max_trials_per_worker):
            self.idle[rt.slot.id] = rt.worker
            if rt.worker.trials > 1:  # what the trial started goes (the first's ran the setup)
                self.trees.scan(self._worker_pids(), force=True)
                self.trees.sweep(rt.slot.id, rt.spawned_epoch, keep=frozenset({rt.process.pid}))
        else:  # fresh mode; or after a failure, or max_trials_per_worker trials
            self._retire(rt.worker, rt.slot.id, keep_lease=True)
        self.slots.release(rt.slot, keep_lease=rt.slot.id in self.idle)
        return verdict, measured, ended_at

    def _record(self, rt: RunningTrial, verdict: _outcome.Verdict, measured: dict[str, object],
                ended_at: float) -> None:
        retry = _outcome.retry_attempt(verdict.fail_reason, rt.attempt,
                                       self.config.scheduler.max_retries)
        if not rt.reaped:
            try:
                self.records.trial_ended(rt, verdict, measured, ended_at, retry)
            except optuna.exceptions.UpdateFinishedTrialError:
                rt.reaped = True
        if rt.reaped:  # reaped by a partner while we were stopped: its record stands, not ours
            verdict = _outcome.Verdict(TrialState.FAIL, None, "lost", "reaped by another "
                                       "orchestrator while this one was stopped; result dropped")
        elif self.auto is not None:
            self.auto.observe(rt.number, measured,
                              rt.last_step if verdict.state == TrialState.COMPLETE else None)
        self.reporter.finished(FinishedTrial(
            number=rt.number, slot=rt.slot.label, state=verdict.state, value=verdict.value,
            duration_s=time.monotonic() - rt.spawned_at, fail_reason=verdict.fail_reason,
            error=verdict.error, log_path=str(rt.log_path) if rt.log_path else None))
        # A trial the study's time limit stopped (study.timeout_grace_s) is not the
        # objective's failure: the failure policy does not count it.
        failed = verdict.state == TrialState.FAIL and rt.stop_reason != "study_timeout"
        halt = self.failures.observe(rt.number, failed,
                                     verdict.fail_reason, verdict.error, retry is not None)
        if halt is not None and self.halted is None and not self._signals:
            self._halt(halt)

    # --- deadlines, heartbeats, stopping ---------------------------------------------------

    def _cap_logs(self) -> None:
        """Rotate running trials' logs that grew over scheduler.log_max_mib (every few s)."""
        now = time.monotonic()
        if now - self._logs_checked < _LOG_CHECK_S:
            return
        self._logs_checked = now
        for rt in self.running.values():
            if rt.log_path is not None:
                cap_log(rt.log_path, self._log_cap)

    def _check_study_deadline(self) -> None:
        """study.timeout_s: past it nothing new starts (the loop ends once the running trials
        end); past study.timeout_grace_s more, those still running are stopped."""
        if self._deadline is None:
            return
        now = time.monotonic()
        if now >= self._deadline and not self.timed_out:
            self.timed_out = True
            self._stopping = True
        grace = self.config.study.timeout_grace_s
        if not self.timed_out or grace is None or now < self._deadline + grace:
            return
        for rt in self.running.values():
            if rt.stop_reason is None:
                rt.stop_reason = "study_timeout"
                signal_tree(rt.process.pid, signal.SIGTERM)
                rt.kill_at = now + self.config.scheduler.kill_grace_s

    def _worker_pids(self) -> dict[int, int]:
        """{slot id: pid} of every worker process, running a trial or idle."""
        pids = {slot_id: w.process.pid for slot_id, w in self.idle.items()}
        pids.update({slot_id: rt.process.pid for slot_id, rt in self.running.items()})
        return pids

    def _own_trial_ids(self) -> set[int]:
        """Trials this orchestrator holds RUNNING: on a slot, or asked ahead of one."""
        return {rt.trial._trial_id for rt in self.running.values()} | {
            a.trial._trial_id for a in self.ready}

    def _stop_all(self, storage_failed: bool = False) -> None:
        """Leave nothing running and no trial RUNNING, whatever brought us here.

        Children are stopped first (SIGTERM, SIGKILL after the grace period); only then are
        their trials written, so a broken storage cannot leave processes behind. If the
        storage is what failed, their trials stay RUNNING there and the next run on this
        host recovers them at once (their pids are gone).
        """
        self._stopping = True
        self._retire_idle()
        if not storage_failed:
            self.records.fail_unstarted(self.ready)
        if not self.running:
            return
        grace_end = time.monotonic() + self.config.scheduler.kill_grace_s
        for rt in self.running.values():
            if rt.stop_reason is None:
                rt.stop_reason = "interrupted"
            if rt.process.poll() is None:
                signal_tree(rt.process.pid, signal.SIGTERM if self._signals < 2 else signal.SIGKILL)
        killed = False
        while any(rt.process.poll() is None for rt in self.running.values()):
            if not killed and time.monotonic() >= grace_end:
                killed = True
                for rt in self.running.values():
                    signal_tree(rt.process.pid, signal.SIGKILL)
            time.sleep(0.05)
        for rt in list(self.running.values()):
            _channel.drain(rt, self.sampler)
            if storage_failed:
                self._retire(rt.worker, rt.slot.id, keep_lease=True)
                self.slots.release(rt.slot)
                del self.running[rt.slot.id]
                continue
            try:
                self._finish(rt)
            except _STORAGE_ERRORS:
                storage_failed = True  # keep stopping and releasing the others


def _oom_killed_since(count_at_spawn: int | None) -> bool:
    """Has the kernel's OOM killer acted in our cgroup since the trial's spawn?"""
    now = cgroup_oom_kills()
    return count_at_spawn is not None and now is not None and now > count_at_spawn
