"""The orchestrator: the one process per host that talks to the storage.

Data flow per trial::

    study.ask() -> free slot -> child spawned with its env fixed (GPU pinned, threads set)
      child: suggest/report/should_prune/set_user_attr -> pipe -> real optuna.Trial here
      child: result (value / pruned / error) or death -> classified -> study.tell()

This module is the loop: its recipe, the ordered duties of each round (``_duties``, run and
timed by _recipe), launching (the first wave of reuse workers, filling free slots, spawning a
trial on its slot, the GPU packer's levels) and a trial's end; the parts live beside it: the
model (_trial), where trials come from (_asking), the slots' workers (_workers), child
processes (_process), the pipe (_channel, _calls), outcome rules (_outcome), storage writes
(_writes), heartbeats and reaping (_recovery), stopping (_stopping), and
pruner.min_resource=auto (pruning/_auto).

A public module of the scheduler, apart from its face: it imports Optuna, which the first wave
starts before (scheduler/__init__.py).

Lifecycle: ``run()`` returns an exit code (0 done, 130 stopped by a stop signal). Whatever
happens, no trial this orchestrator started is left RUNNING: the ``finally`` path kills
remaining children and fails their trials as ``interrupted``.
"""

from __future__ import annotations

import contextlib
import select
import signal
import sqlite3
import time
from datetime import datetime
from types import FrameType

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from hpo_orchestrator import keys
from hpo_orchestrator._signals import handling_stop_signals
from hpo_orchestrator.config import Config
from hpo_orchestrator.db import StorageUnavailable, first_line, trouble_of
from hpo_orchestrator.db.connect import sqlite_path
from hpo_orchestrator.gpu import GpuBackend, nvidia_icd_env
from hpo_orchestrator.placement import Layout, Packer, Slot, forget_packing
from hpo_orchestrator.pruning import AutoPruner, PrunerTuner
from hpo_orchestrator.scheduler import _calls, _outcome
from hpo_orchestrator.scheduler._asking import Asking
from hpo_orchestrator.scheduler._budget import Budget
from hpo_orchestrator.scheduler._deadlines import LoopClock, StudyDeadline, enforce_deadlines, stop_faulty
from hpo_orchestrator.scheduler._failures import FailurePolicy, Halt, disk_full
from hpo_orchestrator.scheduler._logs import (
    LogCap,
    ensure_run_dir,
    keep_traceback,
    take_startup_log,
    trial_log_path,
)
from hpo_orchestrator.scheduler._process import cgroup_oom_kills, log_tail, oom_killed_since, signal_tree
from hpo_orchestrator.scheduler._recipe import Duty, Recipe
from hpo_orchestrator.scheduler._recovery import Recovery
from hpo_orchestrator.scheduler._stopping import stop_running, wait_stopped
from hpo_orchestrator.scheduler._tree import become_subreaper, restore_subreaper, sweep_left_behind
from hpo_orchestrator.scheduler._trial import Asked, FinishedTrial, Reporter, RunningTrial
from hpo_orchestrator.scheduler._workers import Workers, first_imports
from hpo_orchestrator.scheduler._writes import RunRecords
from hpo_orchestrator.study import SqliteWatch, StorageLost, StudySpace, read_study_space, save_held
from hpo_orchestrator.telemetry import TelemetryRetention, TelemetrySampler
from hpo_orchestrator.worker import Job

__all__ = ["Orchestrator"]

EXIT_OK = 0
EXIT_INTERRUPTED = 130
_POLL_S = 0.1
# Reuse mode: how long the run waits for its first workers' start-up (imports, the
# objective's setup) before it asks their trials anyway (a setup that hangs then shows as a
# running trial, whose scheduler.trial_timeout_s applies).
_FIRST_WAVE_WAIT_S = 30.0
# What the storage raises when it cannot write: Optuna's wrapper for failed commits,
# SQLAlchemy's errors (which Optuna lets through elsewhere) and the sqlite driver's own.
_STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, SQLAlchemyError, sqlite3.Error,
                   StorageUnavailable)


class Orchestrator:
    def __init__(self, config: Config, study: optuna.Study, storage: optuna.storages.RDBStorage,
                 budget: Budget, layout: Layout, reporter: Reporter,
                 sampler: TelemetrySampler | None = None, backend: GpuBackend | None = None,
                 workers: Workers | None = None) -> None:
        """``layout``: the run's settings and slots (placement/_layout.py); ``workers``: the
        run's first wave, started before the storage (_first_wave.py); default: none yet,
        started by the loop."""
        slots = layout.slots
        self.config = config
        self.study = study
        self.storage = storage
        self.budget = budget
        self.slots = slots
        self.cores = layout.cores  # other runs of this host on this run's cores
        self.threads = layout.threads
        self.reporter = reporter
        self.sampler = sampler
        self.backend = backend
        self.host = layout.settings.host
        self.reuse = config.scheduler.worker_mode == "reuse"
        # what each Job carries for the child's trial.study (worker/_study_view.py)
        self._directions = tuple(d.name.lower() for d in study.directions)
        self.log_dir = layout.settings.run_folder
        self.workers = workers or Workers(slots, {}, config.scheduler.kill_grace_s,
                                          nvidia_icd_env(), self.log_dir,
                                          first_imports(config.objective))
        self.running: dict[int, RunningTrial] = self.workers.running  # slot id -> trial
        self._stopping = False  # shutting down: nothing new is started
        self._signals = 0
        self.deadline = StudyDeadline(config.study.timeout_s, config.study.timeout_grace_s)
        self.clock = LoopClock(_POLL_S)  # the loop's pauses do not count against trials
        self.records = RunRecords(storage, study, self.host, sampler,
                                  config.telemetry.compute_phases)
        self.asking = Asking(study, storage, budget, self.records, slots, backend,
                             config.scheduler.prefetch)
        self.recovery = Recovery(storage, self.records, self.host, self._own_trial_ids,
                                 config.storage.heartbeat_interval_s, config.storage.grace_s,
                                 config.scheduler.max_retries)
        self.auto = AutoPruner.for_config(study, config.pruner)  # pruner.min_resource=auto
        # pruner.tune=auto: replays in a child process, switches study.pruner (pruning/_tune_auto.py)
        self.tuner = PrunerTuner.for_config(study, storage.engine, config.pruner)
        self.log_cap = LogCap(config.scheduler.log_max_mib)
        self.failures = FailurePolicy(config.study.fail_fast, config.study.max_failures)
        self.halted: Halt | None = None  # the failure policy stopped the run (exit 1)
        # a custom objective's space is in its code: checked against the study's at each
        # name's first suggest (study/_space.py); a built-in's was checked as configuration
        self.space = None if config.objective.name != "custom" or config.study.allow_mixed \
            else _space_of(storage, study)
        path = sqlite_path(config.storage.url)
        self.watch = SqliteWatch(path) if path is not None and path.exists() else None
        self._lost: StorageLost | None = None
        # scheduler.trials_per_gpu=auto (and the study attr hpo.packing.<host> on GPU hosts)
        self.packer = Packer(layout.settings, slots, sampler, study) if slots.limits else None
        if self.packer is None:
            forget_packing(study, self.host)  # an earlier run's levels are not this run's
        self.retention = TelemetryRetention(storage.engine, study._study_id, self.host,
                                            config.telemetry.keep_full_s,
                                            config.telemetry.max_rows_per_trial) \
            if sampler is not None else None  # old trials' samples averaged down (telemetry/_retention.py)

    @property
    def timed_out(self) -> bool:
        """study.timeout_s passed: nothing new started after it."""
        return self.deadline.passed

    # --- lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        """Run until n_trials are claimed and finished: 0, or 130 after SIGINT/SIGTERM/SIGHUP.

        Raises RuntimeFailure (exit 1) when the storage stops accepting writes (disk full,
        read-only, server gone), after stopping every child; what was told before stays.
        """
        with handling_stop_signals(self._on_signal):
            return self._run()

    def _run(self) -> int:
        failure: BaseException | None = None
        local_failure = False
        subreaper = become_subreaper()  # orphans of the trials' processes come to us
        try:
            ensure_run_dir(self.log_dir)
            sweep_left_behind(self.log_dir)  # a kill -9-ed run's trials' processes
            self.recovery.reap()
            self.records.record_devices([s.gpu for s in self.slots.slots if s.gpu is not None])
            if self.auto is not None:
                self.auto.seed(self.storage.engine)
            if self.sampler is not None:
                self.sampler.start()
            self.deadline.start()
            self._start_first_wave()
            self.clock.restart()  # the wait for the first wave was no stall of the loop
            recipe = Recipe(self._duties())
            while not recipe.round():
                pass
            self._watch_storage(force=True)  # the last tells went to the file at the path
        except StorageLost as exc:
            failure = exc
        except _STORAGE_ERRORS as exc:
            failure = self._lost_storage() or exc
        except OSError:
            # One of our own files or stdout failed (lock, run folder, a closed pipe), not the
            # trials: they are left RUNNING, as on a storage failure, for the next run to
            # recover, rather than recorded as interrupted by a signal; the CLI names the file.
            local_failure = True
            raise
        finally:
            self._wind_down(failure, local_failure, subreaper)
        if isinstance(failure, StorageUnavailable | StorageLost):
            raise failure
        if failure is not None:  # a step that is not retried: named the same way
            cause = trouble_of(failure) or "unknown"
            raise StorageUnavailable(cause, first_line(failure), None) from failure
        if self._signals:
            return EXIT_INTERRUPTED
        self.halted = self.halted or self.failures.at_end()
        return self.halted.exit_code if self.halted else EXIT_OK

    def _wind_down(self, failure: BaseException | None, local_failure: bool,
                   subreaper: bool | None) -> None:
        """Whatever ended the loop: children stopped, trials written, helpers closed. After a
        storage failure (``failure``) or one of our own files' (``local_failure``) nothing more
        is written: the running trials are left RUNNING for the next run to recover."""
        self._stop_all(storage_failed=failure is not None or local_failure)
        if self.tuner is not None:
            # a replay still running is of no use any more; its note only where writes are safe
            self.tuner.close(record=failure is None and not local_failure)
        self.log_cap.close()  # the last trials' logs held to the cap too
        if self.packer is not None and failure is None:
            self.packer.close()
        self.workers.trees.sweep_all()
        self.slots.stop_waiting()
        restore_subreaper(subreaper)
        if self.sampler is not None:
            self.sampler.stop()
            if failure is None:
                self.records.flush_telemetry(force=True)
                if self.retention is not None:
                    self.retention.maybe_run(force=True)
        if failure is None and not local_failure:
            try:
                self.records.fold_tally()
                self.records.flush_device_choice()  # its trial counts, to the end
            except _STORAGE_ERRORS:
                pass  # the tally only saves status work: it reads the trials past it anyway
            with contextlib.suppress(*_STORAGE_ERRORS):  # status then says "since", no end
                self.cores.finish(self.study)  # a sharing of the cores ends with the run

    def _duties(self) -> list[Duty]:
        """What the loop does each round, in order (scheduler/_recipe.py)."""
        sched = self.config.scheduler
        running = self.running.values
        duties = [
            Duty("study deadline", self._check_deadline),
            Duty("launch", self._launch_unless_stopped),
            Duty("late stop", self._late_stop),
            # right after the launch: a tick between a trial's end and the refill of its
            # place would read a busy GPU as idle (then its level never grows)
            Duty("packing", self._pack),
            Duty("done", self._done, ends_loop=True),
            Duty("calls", self._serve_calls),
            Duty("faulty", lambda: stop_faulty(running(), sched.kill_grace_s)),
            Duty("ended", self._finish_ended),
            Duty("progress", lambda: self.reporter.tick(list(running()))),
            Duty("shared cores", self._check_cores),
            Duty("notes", self._say_notes),
            Duty("setup ended", lambda: self.records.setup_ended(running())),
            Duty("stall clock", lambda: self.clock.discount_stall(running())),
            Duty("trial timeouts", lambda: enforce_deadlines(running(), sched.trial_timeout_s,
                                                             sched.kill_grace_s)),
            Duty("log cap", lambda: self.log_cap.check(rt.log_path for rt in running())),
            Duty("heartbeats", self._beat),
            Duty("storage watch", self._watch_storage),
            Duty("workers", self.workers.tend),
            Duty("telemetry", self.records.flush_telemetry)]
        if self.retention is not None:
            duties.append(Duty("retention", self.retention.maybe_run))
        if self.tuner is not None:
            duties.append(Duty("pruner tuning", self.tuner.tick))
        return duties

    def _watch_storage(self, force: bool = False) -> None:
        """Stop the run when its sqlite file went away under it (study/_lost.py)."""
        lost = self._lost_storage(force)
        if lost is not None:
            raise lost

    def _lost_storage(self, force: bool = True) -> StorageLost | None:
        """The run's sqlite file deleted, replaced or truncated (None: it is the run's still,
        or the storage is no sqlite file), with what the run held saved beside it."""
        if self._lost is not None:
            return self._lost
        what = self.watch.lost(force) if self.watch is not None else None
        if what is None or self.watch is None:
            return None
        self._lost = self._save_lost(what, self.watch)
        return self._lost

    def _save_lost(self, what: str, watch: SqliteWatch) -> StorageLost:
        saved, count, trouble = save_held(watch, what, self.study)
        if saved is None:
            why = f"it could not save its trials ({trouble})" if trouble \
                else "it held no finished trial to save"
            return StorageLost(f"the database {watch.path} {what} while the run wrote to it: "
                               f"the run stopped; {why}",
                               "run the same command again to start the study anew")
        return StorageLost(
            f"the database {watch.path} {what} while the run wrote to it: the run stopped (its "
            f"running trials too) and saved {count} finished trial(s) of study "
            f"{self.study.study_name!r} in {saved}",
            f"load them, or go on with the study, with storage.url=sqlite:///{saved} (and "
            f"--storage sqlite:///{saved} for status and the other commands)")

    def _check_cores(self) -> None:
        """Other runs of this host whose trials share this run's cores: said, and kept in
        hpo.shared_cores.<host> for status (placement/_cores.py)."""
        if self.cores.check():
            self.cores.record(self.study)
        for text in self.cores.take_notes():
            self.reporter.note(text)

    def _say_notes(self) -> None:
        for text in self.slots.take_notes():  # a GPU skipped as busy, or free again
            self.reporter.note(text)

    def _check_deadline(self) -> None:
        if self.deadline.check(self.running.values(), self.config.scheduler.kill_grace_s):
            self._stopping = True

    def _launch_unless_stopped(self) -> None:
        if not self._signals and self.halted is None and not self._space_changed():
            self._launch_ready()

    def _space_changed(self) -> bool:
        """A trial met a change of the study's search space: no trial starts after it (the
        run stops with exit 2 once that trial has ended and failed)."""
        return self.space is not None and self.space.changed is not None

    def _late_stop(self) -> None:
        if self._signals:  # one that came mid-launch found that trial not running yet
            self._interrupt_running()

    def _done(self) -> bool:
        return not self.running and bool(self._signals or self.halted or self.timed_out
                                         or self.asking.study_done())

    def _finish_ended(self) -> None:
        for rt in _calls.ended(list(self.running.values()), self.reuse, self.sampler):
            self._finish(rt)

    def _beat(self) -> None:
        if self.recovery.beat():
            self._drop_reaped()

    def _serve_calls(self) -> None:
        # No wait when a reuse worker's result is in already (read by _answer_calls): ended()
        # takes it now. (A fresh child's trial ends when it exits, which wakes the wait.)
        _calls.serve(list(self.running.values()), 0.0 if self.reuse and any(
            rt.outcome is not None for rt in self.running.values()) else _POLL_S, self.sampler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        self._interrupt_running()
        if self._signals > 1:  # a second Ctrl-C: no more grace
            for rt in self.running.values():
                signal_tree(rt.process.pid, signal.SIGKILL)
            self.records.retrying.give_up()  # nor waiting for the storage to come back

    def _halt(self, halt: Halt) -> None:
        """The failure policy says stop: nothing new starts, running trials are stopped as on
        Ctrl-C (FAIL, interrupted: the same command resumes), and run() returns 1."""
        self.halted = halt
        self._stopping = True
        stop_running(self.running.values(), "interrupted", self.config.scheduler.kill_grace_s,
                     f"stopped by {halt.rule}: {halt.message}")

    def _interrupt_running(self) -> None:
        """Start nothing new; stop each running trial (FAIL, interrupted)."""
        self._stopping = True
        stop_running(self.running.values(), "interrupted", self.config.scheduler.kill_grace_s)

    # --- finishing -------------------------------------------------------------------------

    def _finish(self, rt: RunningTrial) -> None:
        """Free the trial's slot, hand it to a trial asked ahead, then record the end (the
        writes take 20-40 ms that the slot need not wait for)."""
        verdict, measured, ended_at = self._release(rt)
        if self.asking.ready and not self._space_changed():
            self._launch_ready(claim=False)
        self._answer_calls()
        self._record(rt, verdict, measured, ended_at)

    def _release(self, rt: RunningTrial) -> tuple[_outcome.Verdict, dict[str, object], float]:
        """Classify the trial and take it off its slot; its worker stays for the slot's next
        trial (reuse mode, after a success) or is retired."""
        verdict = _outcome.classify(
            stop_reason=rt.stop_reason, outcome=rt.outcome, returncode=rt.process.returncode,
            timeout_s=self.config.scheduler.trial_timeout_s,
            oom_killed=lambda: oom_killed_since(rt.oom_kills_at_spawn),
            log_tail=lambda: log_tail(rt.log_path) if rt.log_path else "",
            protocol_error=rt.protocol_error, stop_error=rt.stop_error,
            directions=tuple(self.config.study.objectives))
        ended_at = rt.ended_epoch(time.time())
        if rt.process.poll() is not None:
            signal_tree(rt.process.pid, signal.SIGKILL)  # leftovers in its group, if any
        measured = self.records.measure(rt)
        self.records.record_device_choice(rt)
        if verdict.state == TrialState.FAIL and rt.outcome is not None:
            kept = keep_traceback(rt.outcome.traceback, rt.log_path)
            if kept:
                measured[keys.TRACEBACK] = kept
        del self.running[rt.slot.id]
        if self.packer is not None:  # before the slot is handed on: an OOM lowers its GPU's level
            peak = measured.get(keys.GPU_MEM_PEAK_MIB)
            self.packer.trial_ended(rt.view(), verdict.fail_reason,
                                    float(peak) if isinstance(peak, (int, float)) else None)
        alive = rt.process.poll() is None and rt.stop_reason is None  # not one we signalled
        if _outcome.keep_worker(reuse=self.reuse, alive=alive,
                                connection_open=rt.connection_open, stopping=bool(self._signals),
                                state=verdict.state, trials_run=rt.worker.trials,
                                max_trials=self.config.scheduler.max_trials_per_worker):
            self.workers.keep_idle(rt)
        else:  # fresh mode; or after a failure, or max_trials_per_worker trials
            self.workers.retire(rt.worker, rt.slot.id, keep_lease=True)
        self.slots.release(rt.slot, keep_lease=rt.slot.id in self.workers.idle)
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
        if rt.reaped:  # finished elsewhere: its record stands, not ours; say what it holds
            verdict = self.records.finished_elsewhere(rt)
        elif self.auto is not None:
            self.auto.observe(rt.number, measured,
                              rt.last_step if verdict.state == TrialState.COMPLETE else None)
        self.reporter.finished(FinishedTrial(
            number=rt.number, slot=rt.slot.label, state=verdict.state, value=verdict.value,
            duration_s=ended_at - rt.spawned_epoch, fail_reason=verdict.fail_reason,
            error=verdict.error, log_path=str(rt.log_path) if rt.log_path else None,
            retried=retry is not None and not rt.reaped))
        # A trial the study's time limit stopped (study.timeout_grace_s) is not the
        # objective's failure: the failure policy does not count it.
        failed = verdict.state == TrialState.FAIL and rt.stop_reason != "study_timeout"
        halt = self.failures.observe(rt.number, failed,
                                     verdict.fail_reason, verdict.error, retry is not None)
        if verdict.fail_reason == "disk_full" and not rt.reaped:
            halt = disk_full(rt.number, verdict.error, self.log_dir)
        if self.space is not None and self.space.changed is not None:
            halt = Halt(f"{self.space.changed} (trial {rt.number})", self.space.hint(),
                        "the study's search space", exit_code=2)
        if halt is not None and self.halted is None and not self._signals:
            self._halt(halt)

    # --- deadlines, heartbeats, stopping ---------------------------------------------------

    def _drop_reaped(self) -> None:
        """A partner reaped trials of ours (we were stopped past the grace period): stop their
        children now (stop_faulty), not at a next write that may never come; drop those asked
        ahead (the reaper enqueued their retries)."""
        on_slots = {rt.trial._trial_id: rt for rt in self.running.values() if not rt.reaped}
        gone = self.records.no_longer_running([*on_slots, *(
            a.trial._trial_id for a in self.asking.ready)])
        for trial_id in gone & on_slots.keys():
            on_slots[trial_id].reaped = True
        self.asking.ready[:] = [a for a in self.asking.ready if a.trial._trial_id not in gone]

    def _own_trial_ids(self) -> set[int]:
        """Trials this orchestrator holds RUNNING: on a slot, or asked ahead of one."""
        return {rt.trial._trial_id for rt in self.running.values()} | {
            a.trial._trial_id for a in self.asking.ready}

    def _stop_all(self, storage_failed: bool = False) -> None:
        """Leave nothing running and no trial RUNNING, whatever brought us here.

        Children are stopped first (SIGTERM, SIGKILL after the grace period); only then are
        their trials written, so a broken storage cannot leave processes behind. If the
        storage is what failed, their trials stay RUNNING there and the next run on this
        host recovers them at once (their pids are gone).
        """
        self._stopping = True
        self.workers.retire_idle()
        if not storage_failed:
            self.records.requeue_unstarted(self.asking.ready)
        wait_stopped(self.running.values(), self.config.scheduler.kill_grace_s,
                     hard=self._signals > 1)
        for rt in list(self.running.values()):
            _calls.drain(rt, self.sampler)
            if storage_failed:
                self.workers.retire(rt.worker, rt.slot.id, keep_lease=True)
                self.slots.release(rt.slot)
                del self.running[rt.slot.id]
                continue
            try:
                self._finish(rt)
            except _STORAGE_ERRORS:
                storage_failed = True  # keep stopping and releasing the others

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
            self.threads = self.packer.threads_for_next(rt.view() for rt in self.running.values())
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
                          in_setup=in_setup, space=self.space)
        self.running[slot.id] = rt
        self.slots.describe(slot, study=self.study.study_name, trial=trial.number,
                            trial_pid=worker.process.pid)
        if self.sampler is not None:
            self.sampler.watch(slot.id, trial._trial_id, worker.process.pid,
                               slot.gpu_index,
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
        """scheduler.trials_per_gpu=auto (placement/_packer.py): when a GPU's level changes,
        new workers get the cores re-divided, and idle workers above the level go. In reuse
        mode each GPU keeps a spare worker, started up, for the place above its level while
        the study has trials left (scheduler.spare_workers, scheduler/_workers.py)."""
        if self.packer is None or not self.slots.auto:
            return
        self.packer.tick(rt.view() for rt in self.running.values())  # read when a decision is due
        for text in self.packer.take_notes():
            self.reporter.note(text)
        self.workers.retire_over_levels()
        if self.reuse and self.config.scheduler.spare_workers and not self._stopping \
                and self.asking.exhausted_at is None:
            self.workers.keep_spares(self.packer.workers_wanted(), self.threads,
                                     self.config.objective)


def _space_of(storage: optuna.storages.RDBStorage, study: optuna.Study) -> StudySpace:
    """The study's space as its earlier trials suggested it (one read at the run's start)."""
    with storage.engine.connect() as connection:
        return StudySpace(study.study_name, read_study_space(connection, study._study_id))
