"""The slots' worker processes: started for a trial, kept idle between trials (reuse mode),
retired, and the process trees they leave behind.

An idle reuse worker keeps its slot's host-wide lease (its process holds GPU memory and the
objective's setup); retiring it gives the lease back, unless a trial is about to take the
slot.
"""

from __future__ import annotations

from pathlib import Path

from hpo_orchestrator.scheduler._process import retire_worker, start_worker
from hpo_orchestrator.scheduler._slots import Slot, SlotPool
from hpo_orchestrator.scheduler._tree import ProcessTrees
from hpo_orchestrator.scheduler._trial import RunningTrial, Worker
from hpo_orchestrator.worker._env import ChildEnv

__all__ = ["Workers"]


class Workers:
    """``running`` is the loop's own {slot id: trial} (shared, never copied): the process
    trees are walked from every worker, busy or idle."""

    def __init__(self, slots: SlotPool, running: dict[int, RunningTrial], kill_grace_s: float,
                 icd_env: dict[str, str], run_dir: Path | None = None) -> None:
        self.slots = slots
        self.running = running
        self.kill_grace_s = kill_grace_s
        self.icd_env = icd_env
        self.idle: dict[int, Worker] = {}  # slot id -> a reuse worker waiting for its next trial
        # what the trials' processes started, also on disk in the run folder (docs: README)
        self.trees = ProcessTrees(run_dir)

    def for_trial(self, slot: Slot, trial_number: int, attempt: int, threads: int,
                  log_path: Path) -> Worker:
        """The slot's idle worker, or a new process pinned to the slot."""
        worker = self.idle.pop(slot.id, None)
        if worker is not None and (worker.process.poll() is not None
                                   or worker.connection.pending()):
            # Died while idle (killed from outside), or wrote after its trial ended (a thread
            # of the objective that lived on): the next trial gets a fresh process.
            self.retire(worker, slot.id, keep_lease=True)
            worker = None
        if worker is None:
            child = ChildEnv(trial_number=trial_number, attempt=attempt, slot=slot.id,
                             gpu_index=slot.gpu.index if slot.gpu else None,
                             gpu_uuid=slot.gpu.uuid if slot.gpu else None,
                             cuda_visible_devices=slot.cuda_visible_devices,
                             num_threads=threads)
            worker = start_worker(child, self.icd_env if slot.gpu is not None else {}, slot.id,
                                  log_path)
        return worker

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
        """Stop the worker and its tree; its slot's lease goes back unless ``keep_lease``."""
        self.trees.scan(self.pids(), force=True)  # its tree, before it comes apart
        retire_worker(worker, self.kill_grace_s)
        self.trees.sweep(slot_id)
        if not keep_lease:
            self.slots.drop_lease(slot_id)

    def retire_idle(self) -> None:
        for slot_id, worker in list(self.idle.items()):
            del self.idle[slot_id]
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
        for slot_id, worker in list(self.idle.items()):
            if self.slots.yields(self.slots.slots[slot_id]):
                del self.idle[slot_id]
                self.retire(worker, slot_id)

    def pids(self) -> dict[int, int]:
        """{slot id: pid} of every worker process, running a trial or idle."""
        pids = {slot_id: w.process.pid for slot_id, w in self.idle.items()}
        pids.update({slot_id: rt.process.pid for slot_id, rt in self.running.items()})
        return pids
