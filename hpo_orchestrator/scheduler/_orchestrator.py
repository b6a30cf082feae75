"""The orchestrator: the one process per host that talks to the storage.

Data flow per trial::

    study.ask() -> free slot -> child spawned with its env fixed (GPU pinned, threads set)
      child: suggest/report/should_prune/set_user_attr -> pipe -> real optuna.Trial here
      child: result (value / pruned / error) or death -> classified -> study.tell()

Lifecycle: ``run()`` returns an exit code (0 done, 130 stopped by SIGINT/SIGTERM). Whatever
happens, no trial this orchestrator started is left RUNNING: the ``finally`` path kills
remaining children and fails their trials as ``interrupted``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import IO, Any, Protocol

import optuna
import psutil
from optuna.trial import TrialState
from sqlalchemy import Column, Integer, MetaData, String, Table, Text, text
from sqlalchemy.engine import Connection as DbConnection
from sqlalchemy.exc import SQLAlchemyError

from hpo_orchestrator.config import Config
from hpo_orchestrator.errors import RuntimeFailure
from hpo_orchestrator.gpu import GpuBackend
from hpo_orchestrator.gpu._opencl import nvidia_icd_env
from hpo_orchestrator.pruning._auto import AutoMinResource, StepTiming, fit_step_timing, stored_timings
from hpo_orchestrator.scheduler._budget import Budget
from hpo_orchestrator.scheduler._slots import Slot, SlotPool
from hpo_orchestrator.study import build_pruner
from hpo_orchestrator.tables import insert_samples, insert_summary
from hpo_orchestrator.telemetry import TelemetrySampler, TrialTelemetry
from hpo_orchestrator.worker import TRIAL_METHODS, Job, TrialOutcome

__all__ = ["FinishedTrial", "Orchestrator", "Reporter", "RunningTrial", "params_mismatch"]

EXIT_OK = 0
EXIT_INTERRUPTED = 130
_POLL_S = 0.1
_RETRYABLE = ("oom", "killed", "lost")  # failures that were not the objective's fault
# What the storage raises when it cannot write: Optuna's wrapper for failed commits,
# SQLAlchemy's errors (which Optuna lets through elsewhere) and the sqlite driver's own.
_STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, SQLAlchemyError, sqlite3.Error)
_TELEMETRY_FLUSH_S = 5.0  # how often buffered samples are written (and at every trial's end)
_RECHECK_BUDGET_S = 1.0  # once spent, how often to look again (retries may be enqueued)


@dataclass
class Worker:
    """A child process of one slot. Fresh mode: one trial. Reuse mode: many, one at a time."""

    process: subprocess.Popen[bytes]
    connection: Connection
    log: IO[bytes]
    cuda_visible_devices: str
    trials: int = 0  # trials started in it so far


@dataclass
class RunningTrial:
    trial: optuna.Trial
    slot: Slot
    worker: Worker  # the process running it (in reuse mode it outlives the trial)
    spawned_at: float  # monotonic
    spawned_epoch: float
    oom_kills_at_spawn: int | None
    started_at: float | None = None
    phase: str | None = None
    last_step: int | None = None
    reports: list[tuple[int, float]] = field(default_factory=list)  # (step, s since spawn)
    first_decision_at: float | None = None  # first should_prune answer
    params_effective: dict[str, Any] | None = None
    opencl_platform: str | None = None
    outcome: TrialOutcome | None = None
    stop_reason: str | None = None  # timeout / interrupted: we stopped it
    kill_at: float | None = None  # when SIGTERM's grace runs out
    connection_open: bool = True

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.worker.process

    @property
    def connection(self) -> Connection:
        return self.worker.connection

    @property
    def log(self) -> IO[bytes]:
        return self.worker.log


@dataclass(frozen=True)
class _Asked:
    """A trial claimed from the budget and asked, not yet given to a slot (scheduler.prefetch)."""

    trial: optuna.Trial
    oom_retry: bool  # a retry of a trial that ran out of GPU memory: placed by free memory


@dataclass(frozen=True)
class FinishedTrial:
    number: int
    slot: str
    state: TrialState
    value: float | None
    duration_s: float
    fail_reason: str | None = None
    error: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


class Reporter(Protocol):
    """Live progress; called from the orchestrator's loop only."""

    def started(self, rt: RunningTrial) -> None: ...

    def finished(self, done: FinishedTrial) -> None: ...

    def tick(self, running: list[RunningTrial]) -> None: ...


def _cgroup_oom_kills() -> int | None:
    """The kernel OOM killer's count for our cgroup (v2), to tell 'oom' from 'killed'."""
    try:
        with open("/proc/self/cgroup") as handle:
            path = handle.read().strip().split("::", 1)[-1]
        with open(f"/sys/fs/cgroup{path}/memory.events") as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _signal_tree(pid: int, sig: int) -> None:
    """Signal a child, its process group and every descendant (DataLoader workers...)."""
    try:
        targets = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        targets = []
    try:
        os.killpg(pid, sig)  # children run in their own session: pgid == pid
    except OSError:
        pass
    for proc in targets:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


# Optuna's table of trial user attrs, for writing several in one transaction (_write_attrs).
_user_attrs_table = Table(
    "trial_user_attributes", MetaData(),
    Column("trial_user_attribute_id", Integer, primary_key=True),
    Column("trial_id", Integer),
    Column("key", String(512)),
    Column("value_json", Text),
)


def _first_line(exc: BaseException) -> str:
    """The database driver's own message (e.g. 'database or disk is full'), found under
    Optuna's and SQLAlchemy's wrappers, without the SQL statement and its parameters."""
    origin: BaseException = exc
    while True:
        inner = getattr(origin, "orig", None) or origin.__cause__
        if not isinstance(inner, BaseException):
            break
        origin = inner
    text = str(origin).strip().splitlines()
    return text[0] if text else type(origin).__name__


def _tail(log: IO[bytes], limit: int = 4096) -> str:
    """The last non-empty line a child printed (native crashes only say it there)."""
    try:
        log.flush()
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - limit))
        lines = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, ValueError):
        return ""
    return lines[-1].strip() if lines else ""


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
        self.finished: list[FinishedTrial] = []
        self.ready: list[_Asked] = []  # asked ahead of a free slot
        self._stopping = False  # shutting down: nothing new is started
        self._signals = 0
        self._exhausted_at: float | None = None  # when a claim last found the budget spent
        self._attempts: dict[int, int] = {}  # trial number -> attempt (see _attempt_of)
        self._last_heartbeat = 0.0
        self._last_flush = 0.0
        self._icd_env = nvidia_icd_env()
        self.auto: AutoMinResource | None = None  # pruner.min_resource=auto
        pruner = config.pruner
        if getattr(pruner, "min_resource", None) == "auto":
            fixed_max = pruner.max_resource if isinstance(pruner.max_resource, int) else None
            self.auto = AutoMinResource(pruner.startup_share, max_step=fixed_max)

    # --- lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        """Run until n_trials are claimed and finished: 0, or 130 after SIGINT/SIGTERM.

        Raises RuntimeFailure (exit 1) when the storage stops accepting writes (disk full,
        read-only, server gone), after stopping every child; what was told before stays.
        """
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failure: BaseException | None = None
        try:
            self._reap_stale()
            self._record_devices()
            self._seed_min_resource()
            if self.sampler is not None:
                self.sampler.start()
            while True:
                if not self._signals:
                    self._launch_ready()
                if not self.running and (self._signals or self._study_done()):
                    break
                self._serve(timeout=_POLL_S)
                self._enforce_deadlines()
                self._heartbeat()
                self._flush_telemetry()
        except _STORAGE_ERRORS as exc:
            failure = exc
        finally:
            self._stop_all(storage_failed=failure is not None)
            if self.sampler is not None:
                self.sampler.stop()
                if failure is None:
                    self._flush_telemetry(force=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failure is not None:
            raise RuntimeFailure(
                f"the storage stopped accepting writes: {_first_line(failure)}",
                "free disk space or fix the database's permissions, then run the same command "
                "again: finished trials are kept, interrupted ones are recovered") from failure
        return EXIT_INTERRUPTED if self._signals else EXIT_OK

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        self._stopping = True
        now = time.monotonic()
        for rt in self.running.values():
            if rt.stop_reason is None:
                rt.stop_reason = "interrupted"
                _signal_tree(rt.process.pid, signal.SIGTERM)
                rt.kill_at = now + self.config.scheduler.kill_grace_s
            if self._signals > 1:  # a second Ctrl-C: no more grace
                _signal_tree(rt.process.pid, signal.SIGKILL)

    # --- launching -------------------------------------------------------------------------

    def _launch_ready(self, claim: bool = True) -> None:
        """Fill free slots (a slot first: a lease on this host; then a trial: a pre-asked one,
        or a new claim on the budget), then ask ahead for the next free slot.

        ``claim=False``: only hand out trials already asked (from _finish, before its trial
        is told: a new ask should see that result).
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
                self._spawn(asked.trial, slot)
            except BaseException:
                self.slots.release(slot, keep_lease=slot.id in self.idle)
                raise
        if claim:
            self._prefetch()

    def _claim(self, oom_retry: bool) -> _Asked | None:
        """A new trial from the shared budget (retries, WAITING, are asked first)."""
        trial = self.budget.claim(self.study.ask)
        if trial is None:
            self._exhausted_at = time.monotonic()
            return None
        self._exhausted_at = None
        self.storage.record_heartbeat(trial._trial_id)  # ours from the start
        self._attempt_of(trial)  # read now (remembered), not when its slot is waiting for it
        return _Asked(trial, oom_retry)

    def _prefetch(self) -> None:
        """Ask ahead (scheduler.prefetch trials) while every slot is busy, so that a slot that
        frees up gets its next trial at once instead of after Optuna's ask (10-30 ms of ORM
        work on the one loop that serves every slot). The sampler then decides a trial before
        the latest results are told, as with one more parallel trial."""
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
        """Is the next trial to ask a retry of one that ran out of GPU memory? (one SQL read;
        Optuna's get_trials would load every WAITING trial through the ORM)"""
        if self.backend is None or not any(s.gpu for s in self.slots.slots):
            return False
        with self.storage.engine.connect() as connection:
            row = connection.execute(text(
                "SELECT a.value_json FROM trials t LEFT JOIN trial_user_attributes a "
                "ON a.trial_id = t.trial_id AND a.key = 'hpo.retry_reason' "
                "WHERE t.study_id = :s AND t.state = 'WAITING' ORDER BY t.trial_id LIMIT 1"),
                {"s": self.study._study_id}).first()
        return row is not None and row[0] == '"oom"'

    def _write_attrs(self, trial_id: int, number: int, attrs: dict[str, Any],
                     started: datetime | None = None) -> None:
        """Set several user attrs of a RUNNING trial in one transaction.

        Optuna's set_user_attr costs one transaction (about 5 ms through its ORM) per key;
        a trial gets about 15 keys, and this loop is the one writer for all slots. Rows are
        written exactly as Optuna writes them (key, JSON value), and only while the trial is
        RUNNING, as Optuna requires.
        """
        if not attrs:
            return
        table = _user_attrs_table
        with self.storage.engine.begin() as connection:
            state = connection.execute(text("SELECT state FROM trials WHERE trial_id = :t"),
                                       {"t": trial_id}).scalar()
            if str(state).split(".")[-1] != "RUNNING":
                raise optuna.exceptions.UpdateFinishedTrialError(
                    f"trial {number} is {state}; its attrs cannot change")
            connection.execute(table.delete().where(table.c.trial_id == trial_id,
                                                    table.c.key.in_(list(attrs))))
            connection.execute(table.insert(), [
                {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                for key, value in attrs.items()])
            if started is not None:  # asked ahead: it started running now, not at its ask
                connection.execute(text("UPDATE trials SET datetime_start = :d WHERE trial_id = :t"),
                                   {"d": started, "t": trial_id})

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

    def _child_env(self, trial: optuna.Trial, slot: Slot) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.threads)
        env.update({
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices,
            "HPO_TRIAL_NUMBER": str(trial.number),
            "HPO_SLOT": str(slot.id),
            "HPO_GPU_INDEX": str(slot.gpu.index) if slot.gpu else "",
            "HPO_GPU_UUID": slot.gpu.uuid if slot.gpu else "",
            "HPO_NUM_THREADS": threads,
            "HPO_ATTEMPT": str(self._attempt_of(trial)),
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
        })
        if slot.gpu is not None:
            env.update(self._icd_env)
        return env

    def _start_worker(self, trial: optuna.Trial, slot: Slot) -> Worker:
        """A new child process pinned to the slot (its environment is fixed here, at birth)."""
        ours, theirs = socket.socketpair()
        log = tempfile.TemporaryFile(prefix=f"hpo-worker-{slot.id}-")
        env = self._child_env(trial, slot)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "hpo_orchestrator.worker", str(theirs.fileno())],
                env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            ours.close()
            log.close()
            raise
        finally:
            theirs.close()
        return Worker(process=process, connection=Connection(ours.detach()), log=log,
                      cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"])

    def _spawn(self, trial: optuna.Trial, slot: Slot) -> None:
        worker = self.idle.pop(slot.id, None)
        if worker is not None and worker.process.poll() is not None:
            self._retire(worker, slot.id, keep_lease=True)  # died while idle (killed from outside)
            worker = None
        try:
            if worker is None:
                worker = self._start_worker(trial, slot)
        except BaseException:
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        worker.trials += 1
        rt = RunningTrial(trial=trial, slot=slot, worker=worker, spawned_at=time.monotonic(),
                          spawned_epoch=time.time(), oom_kills_at_spawn=_cgroup_oom_kills())
        # Optuna's datetime_start is local time and was set at ask(); a trial asked ahead
        # (scheduler.prefetch) waited since, so its start is moved to now.
        started = datetime.fromtimestamp(rt.spawned_epoch)
        self.running[slot.id] = rt
        self.slots.describe(slot, study=self.study.study_name, trial=trial.number,
                            trial_pid=worker.process.pid)
        if self.sampler is not None:
            self.sampler.watch(slot.id, trial._trial_id, worker.process.pid,
                               slot.gpu.index if slot.gpu else None, fresh=worker.trials == 1)
        try:  # the job first, the records after: the worker starts while we write
            rt.connection.send(Job(trial_number=trial.number, objective=_objective_dict(self.config),
                                   study_direction=self.config.study.direction,
                                   attempt=self._attempt_of(trial),
                                   reuse=self.reuse))
        except OSError:  # it died at birth (killed from outside): classified once it is reaped
            rt.connection_open = False
        self._write_attrs(trial._trial_id, trial.number, {
            "hpo.host": self.host,
            "hpo.pid": worker.process.pid,
            "hpo.slot": slot.id,
            "hpo.gpu_index": slot.gpu.index if slot.gpu else None,
            "hpo.gpu_uuid": slot.gpu.uuid if slot.gpu else None,
            "hpo.cuda_visible_devices": worker.cuda_visible_devices,
            "hpo.num_threads": self.threads,
            "hpo.worker_mode": self.config.scheduler.worker_mode,
            "hpo.worker_trial": worker.trials,  # 1: the process was started for this trial
        }, started=started)
        self.reporter.started(rt)

    def _retire_idle(self) -> None:
        for slot_id, worker in list(self.idle.items()):
            del self.idle[slot_id]
            self._retire(worker, slot_id)

    def _retire(self, worker: Worker, slot_id: int, keep_lease: bool = False) -> None:
        """Stop a worker process: ask it to exit, kill it if it does not.

        An idle reuse worker holds its slot's host-wide lease (its process holds GPU memory);
        retiring it gives the lease back, unless a trial is about to take the slot over.
        """
        try:
            worker.connection.send(None)
        except OSError:
            pass
        worker.connection.close()
        try:
            worker.process.wait(timeout=max(1.0, self.config.scheduler.kill_grace_s))
        except subprocess.TimeoutExpired:
            _signal_tree(worker.process.pid, signal.SIGKILL)
            worker.process.wait()
        worker.log.close()
        if not keep_lease:
            self.slots.drop_lease(slot_id)

    # --- serving children ------------------------------------------------------------------

    def _serve(self, timeout: float) -> None:
        by_connection = {rt.connection: rt for rt in self.running.values() if rt.connection_open}
        ready = wait(list(by_connection), timeout=timeout) if by_connection else []
        if not by_connection:
            time.sleep(timeout)
        for connection in ready:
            rt = by_connection[connection]  # type: ignore[index]
            while rt.connection_open and rt.connection.poll():
                try:
                    message = rt.connection.recv()
                except (EOFError, OSError):
                    rt.connection_open = False
                    break
                self._handle(rt, message)
        for rt in list(self.running.values()):
            if rt.process.poll() is not None:
                self._drain(rt)
                self._finish(rt)
            elif self.reuse and rt.outcome is not None:
                self._finish(rt)  # reuse mode: the result is in, the process lives on
        self.reporter.tick(list(self.running.values()))

    def _drain(self, rt: RunningTrial) -> None:
        """Read what the child sent before it exited (its result may still be buffered)."""
        while rt.connection_open:
            try:
                if not rt.connection.poll():
                    break
                self._handle(rt, rt.connection.recv())
            except (EOFError, OSError):
                break
        rt.connection_open = False
        rt.connection.close()

    def _handle(self, rt: RunningTrial, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "call":
            _, method, args, kwargs = message
            self._answer(rt, method, args, kwargs)
        elif kind == "started":  # hpo.startup_s is written with the trial's other results
            rt.started_at = time.monotonic()
        elif kind == "phase":
            rt.phase = message[1]
            if self.sampler is not None:
                self.sampler.set_phase(rt.slot.id, rt.phase)
        elif kind == "result":
            rt.outcome = message[1]

    def _answer(self, rt: RunningTrial, method: str, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
        if method not in TRIAL_METHODS:
            reply: tuple[str, Any] = ("err", AttributeError(f"trial.{method} is not available "
                                                            "in an orchestrated trial"))
        else:
            try:
                reply = ("ok", getattr(rt.trial, method)(*args, **kwargs))
                if method == "report":
                    rt.last_step = int(args[1])
                    rt.reports.append((rt.last_step, time.monotonic() - rt.spawned_at))
                elif method == "should_prune" and rt.first_decision_at is None:
                    rt.first_decision_at = time.monotonic()
                elif method == "set_user_attr" and args and args[0] == "hpo.params_effective":
                    rt.params_effective = args[1] if isinstance(args[1], dict) else None
                elif method == "set_user_attr" and args and args[0] == "hpo.opencl_platform":
                    rt.opencl_platform = str(args[1])
            except Exception as exc:  # the objective's misuse (bad range...) is its error
                reply = ("err", exc)
        try:
            rt.connection.send(reply)
        except OSError:
            rt.connection_open = False

    # --- deadlines, heartbeats, stale trials ------------------------------------------------

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        timeout = self.config.scheduler.trial_timeout_s
        for rt in self.running.values():
            if rt.stop_reason is None and timeout is not None and now - rt.spawned_at > timeout:
                rt.stop_reason = "timeout"
                _signal_tree(rt.process.pid, signal.SIGTERM)
                rt.kill_at = now + self.config.scheduler.kill_grace_s
            if rt.kill_at is not None and now >= rt.kill_at:
                _signal_tree(rt.process.pid, signal.SIGKILL)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < self.config.storage.heartbeat_interval_s:
            return
        self._last_heartbeat = now
        for trial_id in self._own_trial_ids():
            self.storage.record_heartbeat(trial_id)
        self._reap_stale()

    def _reap_stale(self) -> None:
        """Fail RUNNING trials whose orchestrator stopped sending heartbeats ('lost').

        Mirrors optuna.storages.fail_stale_trials, but records why before the state changes.
        """
        study_id = self.study._study_id
        ours = self._own_trial_ids()
        stale = {*self.storage._get_stale_trial_ids(study_id), *self._orphans_here(ours),
                 *self._never_beat(ours)}
        for trial_id in sorted(stale):
            frozen = self.storage.get_trial(trial_id)
            attempt = int(frozen.user_attrs.get("hpo.attempt", 1))
            retry = self._retry_allowed("lost", attempt)
            attrs = {"hpo.fail_reason": "lost",
                     "hpo.error": "its orchestrator stopped sending heartbeats"}
            try:
                self._write_attrs(trial_id, frozen.number, {**attrs, "hpo.retried": True} if retry
                                  else attrs)
                self.storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another orchestrator reaped it first
            if retry:
                self._enqueue_retry(frozen.number, frozen.params, attempt, "lost")

    def _own_trial_ids(self) -> set[int]:
        """Trials this orchestrator holds RUNNING: on a slot, or asked ahead of one."""
        return {rt.trial._trial_id for rt in self.running.values()} | {
            a.trial._trial_id for a in self.ready}

    def _attempt_of(self, trial: optuna.Trial) -> int:
        """1 for a new trial, 2 and up for a retry (read once per trial, then remembered)."""
        if trial.number not in self._attempts:
            with self.storage.engine.connect() as connection:  # one row, not the whole trial
                value = connection.execute(text(
                    "SELECT value_json FROM trial_user_attributes WHERE trial_id = :t "
                    "AND key = 'hpo.attempt'"), {"t": trial._trial_id}).scalar()
            self._attempts[trial.number] = int(json.loads(value)) if value else 1
        return self._attempts[trial.number]

    def _retry_allowed(self, reason: str | None, attempt: int) -> bool:
        return reason in _RETRYABLE and attempt <= self.config.scheduler.max_retries

    def _enqueue_retry(self, number: int, params: dict[str, Any], attempt: int,
                       reason: str) -> None:
        """The same params again, as a WAITING trial that the next ask() picks first.

        The failed attempt is marked ``hpo.retried`` (before it was told) and stops counting
        against n_trials; the retry counts instead.
        """
        self.study.enqueue_trial(params, user_attrs={
            "hpo.retry_of": number, "hpo.retry_reason": reason,
            "hpo.attempt": attempt + 1}, skip_if_exists=False)

    def _never_beat(self, ours: set[int]) -> list[int]:
        """RUNNING trials without any heartbeat, started longer than the grace period ago.

        An orchestrator killed between ask() and its first heartbeat leaves such a trial;
        Optuna's stale check only looks at trials that have a heartbeat row.
        """
        grace = self.config.storage.grace_s
        cutoff = datetime.now() - timedelta(seconds=grace)  # Optuna's datetime_start is local time
        with self.storage.engine.connect() as connection:
            rows = connection.execute(text(
                "SELECT t.trial_id FROM trials t WHERE t.study_id = :s AND t.state = 'RUNNING' "
                "AND t.datetime_start < :cutoff AND NOT EXISTS (SELECT 1 FROM trial_heartbeats h "
                "WHERE h.trial_id = t.trial_id)"), {"s": self.study._study_id, "cutoff": cutoff})
            return [int(tid) for (tid,) in rows if tid not in ours]

    def _orphans_here(self, ours: set[int]) -> list[int]:
        """RUNNING trials started on this host by a process that no longer exists.

        After ``kill -9`` of an orchestrator its trials are found at once by a restart on the
        same host, instead of after the heartbeat grace period. Plain SQL over the RUNNING
        trials' two attrs: Optuna's get_trials would load every trial of the study through
        the ORM first (11 s on a 20,000-trial study, at every heartbeat).
        """
        with self.storage.engine.connect() as connection:
            rows = connection.execute(text(
                "SELECT t.trial_id, h.value_json, p.value_json FROM trials t "
                "JOIN trial_user_attributes h ON h.trial_id = t.trial_id AND h.key = 'hpo.host' "
                "JOIN trial_user_attributes p ON p.trial_id = t.trial_id AND p.key = 'hpo.pid' "
                "WHERE t.study_id = :s AND t.state = 'RUNNING'"), {"s": self.study._study_id}).all()
        orphans = []
        for trial_id, host, pid in rows:
            if trial_id in ours or json.loads(host) != self.host:
                continue
            number = json.loads(pid)
            if isinstance(number, int) and not psutil.pid_exists(number):
                orphans.append(int(trial_id))
        return orphans

    # --- finishing -------------------------------------------------------------------------

    def _classify(self, rt: RunningTrial) -> tuple[TrialState, float | None, str | None, str | None]:
        """(state, value, fail_reason, error) from what we did, what the child said, and how
        its process ended."""
        code = rt.process.returncode
        if rt.stop_reason == "timeout":
            limit = self.config.scheduler.trial_timeout_s
            return TrialState.FAIL, None, "timeout", f"ran past scheduler.trial_timeout_s={limit}"
        outcome = rt.outcome
        if outcome is not None and outcome.kind == "value":
            return TrialState.COMPLETE, outcome.value, None, None
        if outcome is not None and outcome.kind == "pruned":
            return TrialState.PRUNED, None, None, None
        if rt.stop_reason == "interrupted":
            return TrialState.FAIL, None, "interrupted", "stopped by SIGINT/SIGTERM"
        if outcome is not None:
            return TrialState.FAIL, None, outcome.fail_reason, outcome.error
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            oom_kills = _cgroup_oom_kills()
            if sig == signal.SIGKILL and rt.oom_kills_at_spawn is not None \
                    and oom_kills is not None and oom_kills > rt.oom_kills_at_spawn:
                return TrialState.FAIL, None, "oom", "killed by the kernel OOM killer"
            detail = _tail(rt.log)
            return TrialState.FAIL, None, "killed", f"died by {sig.name}" + (
                f": {detail}" if detail else "")
        detail = _tail(rt.log) or "no result"
        return TrialState.FAIL, None, "exception", f"exited with code {code}: {detail}"

    def _finish(self, rt: RunningTrial) -> None:
        """Record a trial's end. Its slot is handed to a trial asked ahead first (the writes
        below take 20-40 ms that the slot need not wait for)."""
        state, value, reason, error = self._classify(rt)
        ended_at = time.time()
        if rt.process.poll() is not None:
            _signal_tree(rt.process.pid, signal.SIGKILL)  # leftovers in its group, if any
        trial = rt.trial
        measured = self._measured_attrs(rt)
        del self.running[rt.slot.id]
        if self._keep_worker(rt, state):
            self.idle[rt.slot.id] = rt.worker
        else:  # fresh mode; or after a failure, or max_trials_per_worker trials
            self._retire(rt.worker, rt.slot.id, keep_lease=True)
        self.slots.release(rt.slot, keep_lease=rt.slot.id in self.idle)
        if self.ready:
            self._launch_ready(claim=False)
        attrs = {"hpo.exit_code": rt.process.returncode, **measured}
        if reason is not None:
            attrs.update({"hpo.fail_reason": reason, "hpo.error": error})
        attempt = self._attempt_of(trial)
        retry = self._retry_allowed(reason, attempt)
        if retry:
            attrs["hpo.retried"] = True
        self._write_attrs(trial._trial_id, trial.number, attrs)
        if state == TrialState.COMPLETE:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=state)
        if retry and reason is not None:
            self._enqueue_retry(trial.number, trial.params, attempt, reason)
        if self.auto is not None and "hpo.step_s" in measured:
            self._update_min_resource(trial.number, StepTiming(
                measured["hpo.overhead_s"], measured["hpo.step_s"]),
                rt.last_step if state == TrialState.COMPLETE else None)
        summary = {
            "trial_id": trial._trial_id, "study_id": self.study._study_id, "number": trial.number,
            "state": state.name, "host": self.host,
            "gpu_index": rt.slot.gpu.index if rt.slot.gpu else None,
            "start_s": rt.spawned_epoch, "end_s": ended_at,
            "startup_s": None if rt.started_at is None else rt.started_at - rt.spawned_at,
            "first_decision_s": measured.get("hpo.first_decision_s"), "last_step": rt.last_step,
            "gpu_util_mean": measured.get("hpo.gpu_util_mean"),
            "gpu_util_compute_mean": measured.get("hpo.gpu_util_compute_mean"),
            "gpu_energy_j": measured.get("hpo.gpu_energy_j"),
            "gpu_verified": measured.get("hpo.gpu_verified"), "fail_reason": reason,
            "opencl_platform": rt.opencl_platform,
            "params_mismatch": json.dumps(measured["hpo.params_mismatch"])
            if "hpo.params_mismatch" in measured else None}
        with self.storage.engine.begin() as connection:  # one transaction for the rest
            insert_summary(connection, summary)
            # Optuna set datetime_complete at tell(); the trial ended when its result came
            # (its slot may already run the next trial), so the stored duration is the trial's.
            connection.execute(text("UPDATE trials SET datetime_complete = :d WHERE trial_id = :t"),
                               {"d": datetime.fromtimestamp(ended_at), "t": trial._trial_id})
            self._flush_telemetry(connection)
        done = FinishedTrial(number=trial.number, slot=rt.slot.label, state=state, value=value,
                             duration_s=time.monotonic() - rt.spawned_at, fail_reason=reason,
                             error=error)
        self.finished.append(done)
        self.reporter.finished(done)

    def _keep_worker(self, rt: RunningTrial, state: TrialState) -> bool:
        return (self.reuse and rt.process.poll() is None and rt.connection_open and not self._signals
                and state in (TrialState.COMPLETE, TrialState.PRUNED)
                and rt.worker.trials < self.config.scheduler.max_trials_per_worker)

    def _measured_attrs(self, rt: RunningTrial) -> dict[str, Any]:
        """Telemetry aggregates, time to the first pruning decision, params that did not apply."""
        attrs: dict[str, Any] = {}
        telemetry: TrialTelemetry | None = None
        if self.sampler is not None:
            telemetry = self.sampler.unwatch(rt.slot.id)
        if telemetry is not None:
            attrs.update(telemetry.attrs(self.config.telemetry.compute_phases))
        if rt.started_at is not None:
            attrs["hpo.startup_s"] = round(rt.started_at - rt.spawned_at, 4)
        if rt.first_decision_at is not None:
            attrs["hpo.first_decision_s"] = round(rt.first_decision_at - rt.spawned_at, 4)
        timing = fit_step_timing(rt.reports, None if rt.started_at is None
                                 else rt.started_at - rt.spawned_at)
        if timing is not None:  # for pruner.min_resource=auto and tune-pruner's cost model
            attrs["hpo.overhead_s"] = round(timing.overhead_s, 4)
            attrs["hpo.step_s"] = round(timing.step_s, 5)
        if rt.params_effective is not None:
            mismatch = params_mismatch(rt.trial.params, rt.params_effective)
            if mismatch:
                attrs["hpo.params_mismatch"] = mismatch
        return attrs

    def _seed_min_resource(self) -> None:
        """pruner.min_resource=auto on a study that already has measured trials (a restart, a
        second host): start from their timings instead of from nothing."""
        if self.auto is None:
            return
        with self.storage.engine.connect() as connection:
            timings = stored_timings(connection, self.study._study_id)
            completed_step = connection.execute(text(
                "SELECT MAX(iv.step) FROM trial_intermediate_values iv JOIN trials t "
                "ON t.trial_id = iv.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE'"),
                {"s": self.study._study_id}).scalar()
        self.auto.max_step = max(self.auto.max_step or 0, completed_step or 0) or None
        changed = False
        for timing in timings.values():
            changed |= self.auto.add(timing)
        if changed:
            self._apply_min_resource()

    def _update_min_resource(self, number: int, timing: StepTiming, completed_step: int | None) -> None:
        assert self.auto is not None
        if self.auto.add(timing, completed_step, at_trial=number):
            self._apply_min_resource()

    def _apply_min_resource(self) -> None:
        """Rebuild the pruner with the new value; record the value and why in the study.

        Trials already running are judged by the new pruner from their next report on
        (``trial.should_prune`` asks ``study.pruner``).
        """
        assert self.auto is not None and self.auto.value is not None
        self.study.pruner = build_pruner(self.config, self.auto.value)
        self.study.set_user_attr("hpo.pruner.min_resource_auto", self.auto.record())

    def _record_devices(self) -> None:
        """This host's devices as a study attr, so status can name a GPU that never got work."""
        gpus = {slot.gpu.index: slot.gpu for slot in self.slots.slots if slot.gpu is not None}
        key = f"hpo.devices.{self.host}"
        # Another orchestrator on this host (another Slurm job) may hold other GPUs of it.
        known = {d["index"]: d for d in self.study.user_attrs.get(key) or []}
        known.update({g.index: {"index": g.index, "uuid": g.uuid, "name": g.name} for g in gpus.values()})
        self.study.set_user_attr(key, [known[i] for i in sorted(known)])

    def _flush_telemetry(self, connection: DbConnection | None = None, force: bool = False) -> None:
        """Write buffered samples: within ``connection`` (a trial's end), or on their own
        every _TELEMETRY_FLUSH_S (now, with ``force``)."""
        now = time.monotonic()
        due = force or connection is not None or now - self._last_flush >= _TELEMETRY_FLUSH_S
        if self.sampler is None or not due:
            return
        self._last_flush = now
        rows = self.sampler.take_rows()
        if connection is not None:
            insert_samples(connection, rows)
        elif rows:
            with self.storage.engine.begin() as fresh:
                insert_samples(fresh, rows)

    def _fail_unstarted(self) -> None:
        """Trials asked ahead that no slot took: FAIL (interrupted), never left RUNNING."""
        while self.ready:
            asked = self.ready.pop(0)
            trial = asked.trial
            try:
                self._write_attrs(trial._trial_id, trial.number, {
                    "hpo.host": self.host, "hpo.fail_reason": "interrupted",
                    "hpo.error": "stopped before a slot took it"})
                self.study.tell(trial, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # reaped by another orchestrator meanwhile

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
            self._fail_unstarted()
        if not self.running:
            return
        grace_end = time.monotonic() + self.config.scheduler.kill_grace_s
        for rt in self.running.values():
            if rt.stop_reason is None:
                rt.stop_reason = "interrupted"
            if rt.process.poll() is None:
                _signal_tree(rt.process.pid, signal.SIGTERM if self._signals < 2 else signal.SIGKILL)
        killed = False
        while any(rt.process.poll() is None for rt in self.running.values()):
            if not killed and time.monotonic() >= grace_end:
                killed = True
                for rt in self.running.values():
                    _signal_tree(rt.process.pid, signal.SIGKILL)
            time.sleep(0.05)
        for rt in list(self.running.values()):
            self._drain(rt)
            if storage_failed:
                self._retire(rt.worker, rt.slot.id, keep_lease=True)
                self.slots.release(rt.slot)
                del self.running[rt.slot.id]
                continue
            try:
                self._finish(rt)
            except _STORAGE_ERRORS:
                storage_failed = True  # keep stopping and releasing the others


def params_mismatch(suggested: dict[str, Any], effective: dict[str, Any]) -> dict[str, list[Any]]:
    """Suggested params the library ran with another value: {name: [suggested, effective]}.

    Only names present in both are compared (libraries add many defaults of their own);
    numbers compare with a relative tolerance, since libraries round-trip floats as text
    (LightGBM's model dump keeps 6 significant digits).
    """
    differing = {}
    for name, wanted in suggested.items():
        if name not in effective:
            continue
        got = effective[name]
        if isinstance(wanted, (int, float)) and isinstance(got, (int, float)) \
                and not isinstance(wanted, bool) and not isinstance(got, bool):
            same = math.isclose(float(wanted), float(got), rel_tol=1e-4, abs_tol=1e-12)
        else:
            same = wanted == got
        if not same:
            differing[name] = [wanted, got]
    return differing


def _objective_dict(config: Config) -> dict[str, Any]:
    return asdict(config.objective)


