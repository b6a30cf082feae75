"""Everything the orchestrator's loop writes to the storage, and the few values it reads.

Optuna's API where it is cheap (ask, tell, enqueue); hpo_orchestrator.db where Optuna's
would cost a transaction per attr or a load of every trial. Attr names are the user contract
(docs/DESIGN.md §2.3). Each storage step is retried through transient trouble (db._retry);
what remains propagates: the loop stops every child and exits 1.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo_orchestrator import keys
from hpo_orchestrator.db import (
    Retrying,
    SummaryRow,
    enqueue_waiting_trial,
    fail_running_trial,
    no_longer_running,
    requeue_unstarted_trial,
    retrying_of,
    write_trial_attrs,
)
from hpo_orchestrator.db.tables import insert_samples
from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.pruning import fit_step_timing
from hpo_orchestrator.scheduler._outcome import Verdict, params_mismatch
from hpo_orchestrator.scheduler._trial import Asked, RunningTrial
from hpo_orchestrator.study import MirrorStorage, Requeue, TrialEnd
from hpo_orchestrator.tally import advance_tally
from hpo_orchestrator.telemetry import TelemetrySampler, TrialTelemetry

__all__ = ["Retry", "RunRecords", "trial_params"]

_TELEMETRY_FLUSH_S = 5.0  # how often buffered samples are written (and at every trial's end)
# How often a trial's end also folds the trials ended since into the study's tally (and at the
# run's end): status reads the trials above the tally's watermark anyway, and folding at every
# end cost about a third of the loop's CPU per trial at 100+ trials/s (docs/BENCHMARKS.md "Costs
# the code cites").
_TALLY_EVERY_S = 1.0


@dataclass(frozen=True)
class Retry:
    """The params of a failed or interrupted trial, to run again as a WAITING trial."""

    number: int  # the trial it retries (hpo.retry_of)
    params: dict[str, Any]
    reason: str  # hpo.retry_reason
    attempt: int  # hpo.attempt of the retry
    lost_runs: int = 0  # hpo.lost_runs: its params were lost this many times in a row

    def user_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {keys.RETRY_OF: self.number, "hpo.retry_reason": self.reason}
        if self.attempt > 1:  # absent: 1 (docs/DESIGN.md §2.3)
            attrs[keys.ATTEMPT] = self.attempt
        if self.lost_runs:
            attrs[keys.LOST_RUNS] = self.lost_runs
        return attrs

    def requeue(self) -> Requeue:
        """As a trial's end enqueues it (study/_end.py)."""
        return Requeue(self.params, self.user_attrs())


def trial_params(trial: optuna.Trial | FrozenTrial) -> dict[str, Any]:
    """The params to run again: those suggested so far, and for a trial that was itself
    enqueued, the fixed params it was not asked for yet (none, when no slot took it)."""
    system = trial.storage.get_trial_system_attrs(trial._trial_id) \
        if isinstance(trial, optuna.Trial) else trial.system_attrs
    return {**(system.get("fixed_params") or {}), **trial.params}


class RunRecords:
    """The loop's writer (single-threaded: the orchestrator's loop is its only caller)."""

    def __init__(self, storage: optuna.storages.RDBStorage, study: optuna.Study, host: str,
                 sampler: TelemetrySampler | None, compute_phases: list[str]) -> None:
        self.storage = storage
        self.study = study
        self.host = host
        self.sampler = sampler
        self.compute_phases = compute_phases
        self._last_flush = 0.0
        self._tally_at = -float("inf")  # when a trial's end last advanced the tally
        # objective.device=auto: the latest measurement, and every trial's learner by GPU
        self._device_choice: dict[str, Any] | None = None
        self._learners: dict[str, dict[str, int]] = {}
        self._learners_written: dict[str, dict[str, int]] = {}
        self._earlier_learners: dict[str, dict[str, int]] | None = None  # an earlier run's
        if not isinstance(study._storage, MirrorStorage):
            raise TypeError("the run's study must use a MirrorStorage (runner.run_study makes it)")
        self.mirror = study._storage

    @property
    def retrying(self) -> Retrying:
        """The run's retrier: the mirror's, once the run started retrying (db/_retry.py)."""
        return retrying_of(self.mirror)

    # --- reads ---------------------------------------------------------------------------

    def attempt_of(self, trial: optuna.Trial) -> int:
        """1 for a new trial, 2 and up for a retry (from the mirror: no statement)."""
        return int(self.mirror.get_trial(trial._trial_id).user_attrs.get(keys.ATTEMPT, 1))

    def next_is_oom_retry(self) -> bool:
        """Is the next trial to ask a retry of one that ran out of GPU memory? Read where
        ask() takes it from: the mirror's WAITING trials (a query for the study's first
        WAITING trial walks every trial of the study when there is none)."""
        def read() -> bool:
            waiting = self.mirror.get_all_trials(self.study._study_id, deepcopy=False,
                                                 states=(TrialState.WAITING,))
            return bool(waiting) and waiting[0].user_attrs.get("hpo.retry_reason") == "oom"
        return self.retrying.call(read)

    # --- writes --------------------------------------------------------------------------

    def write_attrs(self, trial_id: int, number: int, attrs: dict[str, Any],
                    started: datetime | None = None, owned: bool = False) -> None:
        """Several user attrs of a RUNNING trial in one transaction (see db/_run_io.py);
        ``owned``: only while this orchestrator holds it (UpdateFinishedTrialError else)."""
        if not attrs:
            return
        owner = (self.host, os.getpid()) if owned else None

        def step() -> None:
            with self.storage.engine.begin() as connection:
                write_trial_attrs(connection, trial_id, number, attrs, started, owner)
        self.retrying.call(step)

    def asked_attrs(self) -> dict[str, Any]:
        """Who asked a trial, written at once: if this orchestrator dies before a slot takes
        it, a restart on this host recovers it without waiting out the grace period."""
        return {keys.HOST: self.host, keys.ORCHESTRATOR_PID: os.getpid()}

    def asked(self, trial: optuna.Trial) -> None:
        """:meth:`asked_attrs` of a trial ask() did not create (MirrorStorage.starting)."""
        self.write_attrs(trial._trial_id, trial.number, self.asked_attrs())

    def reap(self, trial_id: int, number: int, attrs: dict[str, Any], retry: Retry | None,
             ended: datetime | None = None) -> bool:
        """Fail another orchestrator's RUNNING trial, with its attrs and retry, in one
        transaction, ended at ``ended`` (local time; None: now); False when it had finished
        meanwhile (reaped by someone else)."""
        def step() -> bool:
            with self.storage.engine.begin() as connection:
                try:
                    write_trial_attrs(connection, trial_id, number,
                                           {**attrs, keys.RETRIED: True} if retry else attrs)
                except optuna.exceptions.UpdateFinishedTrialError:
                    return False
                if retry is not None:
                    enqueue_waiting_trial(connection, self.study._study_id, retry.params,
                                               retry.user_attrs())
                return fail_running_trial(connection, trial_id, ended)
        reaped = self.retrying.call(step)
        self.mirror.refresh_soon(self.study._study_id)  # its state and its retry, if any
        return reaped

    def requeue(self, trial_id: int) -> bool:
        """A trial no slot took (this run's, or a dead run's found by reaping) back to WAITING
        (db ``requeue_unstarted_trial``); False when it was no longer RUNNING (reaped by
        someone else)."""
        def step() -> bool:
            with self.storage.engine.begin() as connection:
                return requeue_unstarted_trial(connection, trial_id)
        done = self.retrying.call(step)
        self.mirror.refresh_soon(self.study._study_id)
        return done

    def finished_elsewhere(self, rt: RunningTrial) -> Verdict:
        """What the row of a trial of ours that was finished elsewhere says: reaped by another
        orchestrator while this one was stopped ('lost'), or told outside the run (``optuna
        tell``, another program), with the state and value it holds. This run's result is
        dropped either way."""
        frozen = self.retrying.call(lambda: self.storage.get_trial(rt.trial._trial_id))
        if frozen.user_attrs.get(keys.FAIL_REASON) == "lost":
            return Verdict(TrialState.FAIL, None, "lost", "reaped by another orchestrator "
                           "while this one was stopped; result dropped")
        if not frozen.state.is_finished():  # asked ahead, put back in the queue meanwhile
            return Verdict(TrialState.FAIL, None, "lost", "put back in the queue by another "
                           "orchestrator while this one was stopped; result dropped")
        held = frozen.state.name
        if frozen.values is not None:
            held += " " + ", ".join(f"{v:.6g}" for v in frozen.values)
        return Verdict(frozen.state, None, "outside", f"finished outside this run (optuna tell?): "
                       f"the study has {held}; this run's result dropped")

    def no_longer_running(self, trial_ids: list[int]) -> set[int]:
        """Those of our trials that another orchestrator has finished (reaped)."""
        def read() -> set[int]:
            with self.storage.engine.connect() as connection:
                return no_longer_running(connection, trial_ids)
        return self.retrying.call(read) if trial_ids else set()

    def record_devices(self, gpus: list[GpuInfo]) -> None:
        """This host's devices as a study attr, so status can name a GPU that never got work."""
        key = f"{keys.DEVICES_PREFIX}{self.host}"
        # Another orchestrator on this host (another Slurm job) may hold other GPUs of it.
        known = {d["index"]: d for d in self.study.user_attrs.get(key) or []}
        known.update({g.index: {"index": g.index, "uuid": g.uuid, "name": g.name} for g in gpus})
        self.study.set_user_attr(key, [known[i] for i in sorted(known)])

    def record_device_choice(self, rt: RunningTrial) -> None:
        """objective.device=auto's answers as the study attr ``hpo.device_choice.<host>``: the
        latest measurement, and how many trials trained on each learner on each GPU (one
        measurement chose for a tree size; the GPU's trials may mostly have trained on the
        other learner). Written by a trial that measured, and at the run's end
        (:meth:`flush_device_choice`), so status and report need not read every trial."""
        choice = rt.device_choice
        if not choice:
            return
        gpu = str(rt.slot.gpu.index) if rt.slot.gpu else "-"
        counts = self._learners.setdefault(gpu, {})
        counts[str(choice.get("learner"))] = counts.get(str(choice.get("learner")), 0) + 1
        if not choice.get("measured_here"):
            return
        self._device_choice = {key: value for key, value in choice.items()
                               if key != "measured_here"}
        self._device_choice.update(
            trial=rt.trial.number, gpu=rt.slot.gpu_index,
            time=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
        self.flush_device_choice()

    def flush_device_choice(self) -> None:
        """Write ``hpo.device_choice.<host>`` where its trial counts changed since: the counts
        an earlier run on this host left (read once, before this run's first write) plus this
        run's. Two orchestrators on one host at once: the later write wins, each counting its
        own trials on top of what was there when it first wrote."""
        if self._device_choice is None or self._learners == self._learners_written:
            return
        key = f"{keys.DEVICE_CHOICE_PREFIX}{self.host}"
        if self._earlier_learners is None:  # the shape status accepts, or nothing
            earlier = self.retrying.call(lambda: self.study.user_attrs.get(key))
            self._earlier_learners = earlier.get("learners", {}) \
                if isinstance(earlier, dict) and keys.well_formed(key, earlier) else {}
        total = {gpu: Counter(counts) for gpu, counts in self._earlier_learners.items()}
        for gpu, counts in self._learners.items():
            total.setdefault(gpu, Counter()).update(counts)
        entry = {**self._device_choice, "learners": {gpu: dict(c) for gpu, c in total.items()}}
        self.retrying.call(lambda: self.study.set_user_attr(key, entry))
        self._learners_written = {gpu: dict(counts) for gpu, counts in self._learners.items()}

    def trial_started(self, rt: RunningTrial, threads: int, worker_mode: str) -> None:
        """Where the trial runs. Optuna's datetime_start is local time and was set at ask();
        a trial asked ahead (scheduler.prefetch) waited since, so its start moves to now."""
        slot, worker = rt.slot, rt.worker
        self.write_attrs(rt.trial._trial_id, rt.number, {
            keys.HOST: self.host,
            keys.PID: worker.process.pid,
            keys.SLOT: slot.id,
            keys.GPU_INDEX: slot.gpu_index,
            "hpo.gpu_uuid": slot.gpu.uuid if slot.gpu else None,
            "hpo.cuda_visible_devices": worker.cuda_visible_devices,
            "hpo.num_threads": threads,
            "hpo.worker_mode": worker_mode,
            "hpo.worker_trial": worker.trials,  # 1: the process was started for this trial
            keys.LOG_PATH: None if rt.log_path is None else str(rt.log_path),
            **({keys.SETUP_RUNNING: True} if rt.in_setup else {}),
        }, started=datetime.fromtimestamp(rt.spawned_epoch), owned=True)
        rt.setup_flagged = rt.in_setup

    def setup_ended(self, running: Iterable[RunningTrial]) -> None:
        """``hpo.setup_running`` false for trials whose worker said ready since (status shows
        "setup still running" while it is true); at most once per first-wave worker."""
        for rt in running:
            if rt.setup_flagged and not rt.in_setup:
                rt.setup_flagged = False
                self.write_attrs(rt.trial._trial_id, rt.number, {keys.SETUP_RUNNING: False})

    def measure(self, rt: RunningTrial) -> dict[str, Any]:
        """Telemetry aggregates, time to the first pruning decision, params that did not
        apply; stops sampling the trial's slot for this trial."""
        attrs: dict[str, Any] = {}
        telemetry: TrialTelemetry | None = None
        if self.sampler is not None:
            telemetry = self.sampler.unwatch(rt.slot.id)
        if telemetry is not None:
            attrs.update(telemetry.attrs(self.compute_phases))
            if (rt.device_choice or {}).get("learner") == "cpu" and keys.GPU_VERIFIED in attrs:
                attrs[keys.GPU_VERIFIED] = None  # it measured the CPU faster: no GPU work due
        if rt.setup_flagged:  # it ended before its worker's start-up did
            attrs[keys.SETUP_RUNNING] = False
        if rt.started_at is not None:
            attrs[keys.STARTUP_S] = round(rt.started_at - rt.spawned_at, 4)
        if rt.first_decision_at is not None:
            attrs[keys.FIRST_DECISION_S] = round(rt.first_decision_at - rt.spawned_at, 4)
        timing = fit_step_timing(rt.reports, None if rt.started_at is None
                                 else rt.started_at - rt.spawned_at)
        if timing is not None:  # for pruner.min_resource=auto and tune-pruner's cost model
            attrs[keys.OVERHEAD_S] = round(timing.overhead_s, 4)
            attrs[keys.STEP_S] = round(timing.step_s, 5)
        if rt.params_effective is not None:
            mismatch = params_mismatch(rt.trial.params, rt.params_effective)
            if mismatch:
                attrs[keys.PARAMS_MISMATCH] = mismatch
        return attrs

    def trial_ended(self, rt: RunningTrial, verdict: Verdict, measured: dict[str, Any],
                    ended_at: float, retry_attempt: int | None) -> None:
        """Tell the trial: its attrs, last reports, value, state and real end time, the
        summary row, the buffered telemetry and its retry (``retry_attempt``: the retry's
        hpo.attempt; None: no retry) in one transaction: a ``TrialEnd`` staged on the study's
        MirrorStorage, which writes it at Optuna's tell (study/_end.py): the ``hpo.retried``
        mark and the retry commit together or not at all."""
        trial = rt.trial
        attrs = {keys.EXIT_CODE: rt.process.returncode, **measured}
        if verdict.fail_reason is not None:
            attrs.update({keys.FAIL_REASON: verdict.fail_reason, keys.ERROR: verdict.error})
        retry = None
        if retry_attempt is not None and verdict.fail_reason is not None:
            retry = Retry(trial.number, trial_params(trial), verdict.fail_reason, retry_attempt)
            attrs[keys.RETRIED] = True
        summary = SummaryRow.of(trial._trial_id, self.study._study_id, trial.number,
                                verdict.state.name, {
                                    **measured, keys.HOST: self.host,
                                    keys.GPU_INDEX: rt.slot.gpu_index,
                                    keys.FAIL_REASON: verdict.fail_reason,
                                    keys.OPENCL_PLATFORM: rt.opencl_platform,
                                    # unrounded (the attr has 4 decimals)
                                    keys.STARTUP_S: None if rt.started_at is None
                                    else rt.started_at - rt.spawned_at},
                                start_s=rt.spawned_epoch, end_s=ended_at, last_step=rt.last_step)
        rows = self.sampler.take_rows() if self.sampler is not None else []
        self._last_flush = now = time.monotonic()
        fold = now - self._tally_at >= _TALLY_EVERY_S
        if fold:
            self._tally_at = now
        # Optuna would stamp datetime_complete at tell(); the trial ended when its result came
        # (its slot may already run the next trial), so the stored duration is the trial's.
        self.mirror.stage_end(trial._trial_id, TrialEnd(
            self.study._study_id, self.study.study_name, attrs,
            ended=datetime.fromtimestamp(ended_at), summary=summary, samples=rows,
            retry=None if retry is None else retry.requeue(), fold_tally=fold))
        if verdict.state == TrialState.COMPLETE:
            self.study.tell(trial, verdict.value)
        else:
            self.study.tell(trial, state=verdict.state)
        if retry is not None:
            self.mirror.refresh_soon(self.study._study_id)  # the next ask() takes the retry

    def requeue_unstarted(self, asked: list[Asked]) -> None:
        """Trials asked ahead that no slot took: back to the queue as WAITING trials, with no
        start time. They never ran, so they are no failure (a FAIL with a start read as a
        0.9 s failure in the README's SQL, and as one more failed trial than the run said it
        interrupted); WAITING, they count against n_trials only once a run asks them again,
        under the same number (and fixed params, if they were enqueued); never left RUNNING."""
        while asked:
            self.requeue(asked.pop(0).trial._trial_id)  # False: reaped by another orchestrator meanwhile

    def fold_tally(self) -> None:
        """The run's end: the study's tally takes every trial ended since the last fold, so a
        status after the run reads no trial one by one."""
        def step() -> None:
            with self.storage.engine.begin() as fresh:
                advance_tally(fresh, self.study._study_id, self.study.study_name)
        self.retrying.call(step)

    def flush_telemetry(self, force: bool = False) -> None:
        """Write buffered samples every _TELEMETRY_FLUSH_S (now, with ``force``); a trial's
        end writes them with its summary."""
        now = time.monotonic()
        due = force or now - self._last_flush >= _TELEMETRY_FLUSH_S
        if self.sampler is None or not due:
            return
        self._last_flush = now
        rows = self.sampler.take_rows()

        def step() -> None:
            with self.storage.engine.begin() as fresh:
                insert_samples(fresh, rows)
        if rows:
            self.retrying.call(step)
