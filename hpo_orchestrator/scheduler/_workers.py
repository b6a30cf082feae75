"""The slots' worker processes: started for a trial, kept idle between trials (reuse mode),
started ahead (the run's first wave, spares), retired, and the process trees they leave
behind.

The first wave (reuse mode): before the run asks its first trials, a worker on each slot it
fills first imports the objective and runs its setup, then says ready; until then it waits
among the idle workers, marked ``starting`` (docs/DESIGN.md §3.5).

An idle reuse worker keeps its slot's host-wide lease (its process holds GPU memory and the
objective's setup); retiring it gives the lease back, unless a trial is about to take the
slot.

Spares (trials_per_gpu=auto, reuse mode): a worker started on the slot one level above a
GPU's level, which runs its imports and the objective's setup at once and then waits. When
the level rises, the new place's first trial starts in a process that has started up, instead
of paying the start-up (torch import, CUDA context, the setup's data: 10-20 s on gpu_mix,
docs/BENCHMARKS.md) while the level is being measured. One level ahead, not up to
max_trials_per_gpu: each spare holds the setup's host memory, and the packer may never climb.
"""

from __future__ import annotations

import signal
from pathlib import Path

from hpo_orchestrator.config import LightGBMObjectiveConfig, ObjectiveConfig
from hpo_orchestrator.placement import Slot, SlotPool
from hpo_orchestrator.scheduler._channel import ProtocolError
from hpo_orchestrator.scheduler._logs import spare_log_path
from hpo_orchestrator.scheduler._process import retire_worker, signal_tree, start_worker
from hpo_orchestrator.scheduler._tree import ProcessTrees
from hpo_orchestrator.scheduler._trial import RunningTrial, Worker
from hpo_orchestrator.worker import ChildEnv, Prepare

__all__ = ["Workers", "first_imports"]


def first_imports(objective: ObjectiveConfig) -> tuple[str, ...]:
    """What the objective's processes import before anything else: LightGBM for the built-in
    LightGBM objective (a source build crashed where numpy came first: worker/__main__.py)."""
    return ("lightgbm",) if isinstance(objective, LightGBMObjectiveConfig) else ()


class Workers:
    """``running`` is the loop's own {slot id: trial} (shared, never copied): the process
    trees are walked from every worker, busy or idle."""

    def __init__(self, slots: SlotPool, running: dict[int, RunningTrial], kill_grace_s: float,
                 icd_env: dict[str, str], run_dir: Path | None = None,
                 import_first: tuple[str, ...] = ()) -> None:
        self.slots = slots
        self.running = running
        self.kill_grace_s = kill_grace_s
        self.icd_env = icd_env
        self.import_first = import_first  # worker/_env.py, IMPORT_FIRST
        self.idle: dict[int, Worker] = {}  # slot id -> a reuse worker waiting for its next trial
        self.spares: dict[int, Worker] = {}  # slot id -> a started-up worker waiting for its first
        self.run_dir = run_dir
        # what the trials' processes started, also on disk in the run folder (docs/OBJECTIVES.md)
        self.trees = ProcessTrees(run_dir)

    def for_trial(self, slot: Slot, trial_number: int, attempt: int, threads: int,
                  log_path: Path) -> Worker:
        """The slot's idle worker or spare, or a new process pinned to the slot."""
        worker = self.idle.pop(slot.id, None) or self.spares.pop(slot.id, None)
        if worker is not None and (worker.process.poll() is not None
                                   or self._wrote_while_idle(worker)):
            # Died while idle (killed from outside), or wrote after its trial ended (a thread
            # of the objective that lived on): the next trial gets a fresh process.
            self.retire(worker, slot.id, keep_lease=True)
            worker = None
        if worker is None:
            worker = self._start(slot, trial_number, attempt, threads, log_path)
        return worker

    def _start(self, slot: Slot, trial_number: int | None, attempt: int, threads: int,
               log_path: Path) -> Worker:
        child = ChildEnv(trial_number=trial_number, attempt=attempt, slot=slot.id,
                         gpu_index=slot.gpu_index,
                         gpu_uuid=slot.gpu.uuid if slot.gpu else None,
                         cuda_visible_devices=slot.cuda_visible_devices, num_threads=threads,
                         import_first=self.import_first)
        return start_worker(child, self.icd_env if slot.gpu is not None else {}, slot.id, log_path)

    def _prepared(self, slot: Slot, threads: int, objective: ObjectiveConfig,
                  announce: bool) -> Worker:
        """A worker started up ahead of its first trial (imports, the objective's setup), its
        output in the run folder until that trial's log exists."""
        assert self.run_dir is not None, "start-up output goes to the run folder"
        log_path = spare_log_path(self.run_dir, slot.id)
        worker = self._start(slot, None, 1, threads, log_path)
        worker.prepared = True
        worker.starting = announce
        worker.connection.send(Prepare(objective=objective, log_path=str(log_path),
                                       announce=announce))
        return worker

    def start_first_wave(self, wanted: int, threads: int, objective: ObjectiveConfig) -> None:
        """Reuse mode: workers on the run's first slots until ``wanted`` wait idle (those
        already there count: a wave started before the storage, scheduler/_first_wave.py),
        started up before any trial is asked (the loop waits while ``starting`` lists them),
        so that a trial's RUNNING time is its own. Each new one's slot keeps its lease; they
        wait as idle workers do, and say ``("ready",)`` once started up. A slot of a waiting
        worker comes back from ``acquire`` first (its lease is kept): held meanwhile only."""
        held: list[Slot] = []
        taken: list[Slot] = []
        try:
            while len(self.idle) + len(held) < wanted and (slot := self.slots.acquire()) is not None:
                (taken if slot.id in self.idle else held).append(slot)
            for slot in held:
                self.idle[slot.id] = self._prepared(slot, threads, objective, announce=True)
        finally:
            for slot in held + taken:
                self.slots.release(slot, keep_lease=slot.id in self.idle)

    def starting(self) -> list[Worker]:
        """First-wave workers still starting up: each is read here until it says ready (or
        dies)."""
        for slot_id, worker in list(self.idle.items()):
            if worker.starting and worker.process.poll() is None \
                    and self._wrote_while_idle(worker):
                del self.idle[slot_id]  # broke the protocol: its trial gets a fresh process
                self.retire(worker, slot_id, keep_lease=True)
        return [w for w in self.idle.values() if w.starting and w.process.poll() is None]

    def _wrote_while_idle(self, worker: Worker) -> bool:
        """Did an idle worker send anything but its ``("ready",)``? (An idle worker must not:
        a thread of its objective that lived on. It gets replaced.)"""
        if not worker.connection.pending():
            return False
        if not worker.starting:
            return True
        worker.starting = False
        try:
            return worker.connection.receive() != [("ready",)]
        except ProtocolError:
            return True

    def keep_spares(self, wanted: dict[int, int], threads: int, objective: ObjectiveConfig) -> None:
        """Each GPU gets workers up to ``wanted[gpu]`` (its level, plus one while the level
        may rise): spares are started on its free slots, and those past it retire."""
        for index, count in wanted.items():
            on_gpu = [s for s in self.slots.slots if s.gpu is not None and s.gpu.index == index]
            have = sum(1 for s in on_gpu if s.id in self.running or s.id in self.idle)
            for slot in on_gpu:
                if slot.id in self.running or slot.id in self.idle:
                    continue
                if slot.id in self.spares:
                    have += 1
                    if have > count:
                        self.retire(self.spares.pop(slot.id), slot.id)
                elif have < count and self.slots.hold(slot):
                    self.spares[slot.id] = self._prepared(slot, threads, objective,
                                                          announce=False)
                    have += 1

    def keep_idle(self, rt: RunningTrial) -> None:
        """The trial's worker waits for the slot's next trial; what the trial started goes
        (not after a worker's first trial: that one also ran the objective's setup). A worker
        with no child process left has no descendant (it is a child subreaper): no walk."""
        self.idle[rt.slot.id] = rt.worker
        rt.worker.killed = []
        if rt.worker.trials > 1 and (rt.outcome is None or rt.outcome.children):
            self.trees.scan(self.pids(), force=True)
            rt.worker.killed = self.trees.sweep(rt.slot.id, rt.spawned_epoch,
                                                keep=frozenset({rt.process.pid}))

    def retire(self, worker: Worker, slot_id: int, keep_lease: bool = False) -> None:
        """Stop the worker and its tree; its slot's lease goes back unless ``keep_lease``.
        A spare that never ran a trial is killed at once: it may still be in its setup, and
        the loop would wait for it; its start-up output goes with it."""
        self.trees.scan(self.pids(), force=True)  # its tree, before it comes apart
        unused = worker.prepared and worker.trials == 0
        if unused:
            signal_tree(worker.process.pid, signal.SIGKILL)
        retire_worker(worker, self.kill_grace_s)
        if unused and self.run_dir is not None:
            spare_log_path(self.run_dir, slot_id).unlink(missing_ok=True)
        self.trees.sweep(slot_id)
        if not keep_lease:
            self.slots.drop_lease(slot_id)

    def retire_idle(self) -> None:
        """Idle workers and spares go (the study needs no more trials here, or we stop)."""
        for waiting in (self.idle, self.spares):
            for slot_id, worker in list(waiting.items()):
                del waiting[slot_id]
                self.retire(worker, slot_id)

    def retire_over_levels(self) -> None:
        """trials_per_gpu=auto lowered a GPU's level: its idle workers above the level go
        (they hold GPU memory that its running trials may need)."""
        for slot_id, worker in list(self.idle.items()):
            gpu = self.slots.slots[slot_id].gpu
            if gpu is None:
                continue
            idle_here = sum(1 for i in self.idle if self.slots.slots[i].gpu == gpu)
            if self.slots.busy_on(gpu.index) + idle_here > self.slots.limits[gpu.index]:
                del self.idle[slot_id]
                self.retire(worker, slot_id)

    def tend(self) -> None:
        """Each turn of the loop: walk the process trees; an idle worker on a GPU that another
        orchestrator of this host waits for retires and gives its lease up (_leases.py)."""
        self.trees.scan(self.pids())
        for waiting in (self.idle, self.spares):
            for slot_id, worker in list(waiting.items()):
                if self.slots.yields(self.slots.slots[slot_id]):
                    del waiting[slot_id]
                    self.retire(worker, slot_id)

    def pids(self) -> dict[int, int]:
        """{slot id: pid} of every worker process, running a trial, idle or spare."""
        pids = {slot_id: w.process.pid for slot_id, w in (*self.idle.items(), *self.spares.items())}
        pids.update({slot_id: rt.process.pid for slot_id, rt in self.running.items()})
        return pids
