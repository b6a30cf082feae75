"""The packer: gathers what ``scheduler.trials_per_gpu=auto`` decides from, applies the decision.

Inputs: the GPUs' readings (the telemetry sampler keeps them), the trials that ended on each
GPU (the loop tells :meth:`Packer.trial_ended`), the slot pool's busy places and free memory.
Outputs: each GPU's level in the slot pool, the threads a new worker gets, and the study attr
``hpo.packing.<host>`` (every change with its time, GPU, old -> new and reason; status and
report show it). The rules themselves are pure: scheduler/_packing.py.

Single-threaded: only the orchestrator's loop calls it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import optuna
import psutil

from hpo_orchestrator.config import Config
from hpo_orchestrator.scheduler._packing import (
    Change,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    decide,
    expected_peak_mib,
)
from hpo_orchestrator.scheduler._slots import SlotPool, host_cores, threads_per_trial
from hpo_orchestrator.scheduler._trial import RunningTrial
from hpo_orchestrator.telemetry import TelemetrySampler

__all__ = ["Packer", "detect_mps", "packing_key"]

_DECIDE_EVERY_S = 1.0
_HELD_WRITE_EVERY_S = 10.0  # a changed "held" reason alone is written at most this often
_MAX_CHANGES = 500  # changes kept in the attr (the latest)
_MPS_DAEMONS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def packing_key(host: str) -> str:
    return f"hpo.packing.{host}"


def detect_mps() -> dict[str, Any]:
    """Is CUDA MPS running on this host? Recorded, not required: with MPS the kernels of
    trials sharing a GPU run side by side instead of time-sliced, so packing gains more."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    daemons = set()
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in _MPS_DAEMONS:
            daemons.add(proc.info["name"])
    control = os.path.exists(os.path.join(pipe or "/tmp/nvidia-mps", "control"))
    return {"active": bool(daemons) or control, "pipe_directory": pipe,
            "daemons": sorted(daemons)}


@dataclass(frozen=True)
class _Ended:
    spawned: float  # time.monotonic()
    ended: float
    duration_s: float
    oom: bool
    failed: bool  # a failed trial's duration says nothing about throughput


class Packer:
    def __init__(self, config: Config, pool: SlotPool, sampler: TelemetrySampler | None,
                 study: optuna.Study, host: str) -> None:
        sched = config.scheduler
        self.pool = pool
        self.sampler = sampler
        self.study = study
        self.host = host
        self.cores = host_cores(sched.host_cores)
        self._threads_configured = sched.threads_per_trial
        self.policy = PackingPolicy(target_util=float(sched.target_gpu_util),
                                    max_per_gpu=sched.max_trials_per_gpu)
        now = time.monotonic()
        self.levels = {index: GpuLevel(gpu=index, limit=limit, since=now,
                                       ceiling=self.policy.max_per_gpu)
                       for index, limit in pool.limits.items()}
        self._total_mib = {s.gpu.index: s.gpu.memory_total_mib for s in pool.slots if s.gpu}
        self._ended: dict[int, list[_Ended]] = {index: [] for index in self.levels}
        self._mem_peaks: list[float] = []
        self._changes: list[dict[str, Any]] = []
        self._decided_at = now
        self._written_at = -float("inf")
        mps = detect_mps()
        self._record: dict[str, Any] = {
            "mode": "auto" if pool.auto else "fixed", "target_gpu_util": self.policy.target_util,
            "max_trials_per_gpu": self.policy.max_per_gpu, "cores": self.cores, "mps": mps}
        if pool.auto or mps["active"]:  # fixed levels: worth a write only with MPS
            self._write()

    @property
    def threads(self) -> int:
        """CPU threads for a new worker: the cores over the most trials at once (see
        SlotPool.most_at_once)."""
        return threads_per_trial(self._threads_configured, self.pool.most_at_once, self.cores)

    def trial_ended(self, rt: RunningTrial, fail_reason: str | None,
                    measured: dict[str, object]) -> None:
        gpu = rt.slot.gpu
        if gpu is None or gpu.index not in self._ended:
            return
        # A reuse worker's first trial includes the process start, paid once per worker: the
        # level's throughput is its steady state, so that trial counts from its objective's start.
        begin = rt.started_at if rt.worker.trials == 1 and rt.started_at is not None \
            else rt.spawned_at
        now = time.monotonic()
        self._ended[gpu.index].append(_Ended(rt.spawned_at, now, now - begin, fail_reason == "oom",
                                             fail_reason is not None))
        peak = measured.get("hpo.gpu_mem_peak_mib")
        if isinstance(peak, (int, float)):
            self._mem_peaks.append(float(peak))
        if fail_reason == "oom":  # decided now, before the slot takes its next trial
            self._decided_at = -float("inf")
            self.tick()

    def tick(self) -> bool:
        """Decide every GPU's level (at most every _DECIDE_EVERY_S, at once after an OOM);
        True when one changed."""
        now = time.monotonic()
        if not self.pool.auto or now - self._decided_at < _DECIDE_EVERY_S:
            return False
        self._decided_at = now
        running_peaks = [] if self.sampler is None else [
            p for index in self.levels for p in self.sampler.running_mem_peaks(index)]
        host = HostObservation(cores=self.cores, concurrency=self.pool.concurrency,
                               cap=self.pool.cap,
                               mem_peak_mib=expected_peak_mib(self._mem_peaks, running_peaks))
        changes: list[Change] = []
        held_changed = False
        for index, state in self.levels.items():
            new, change = decide(self.policy, state, self._observe(state, now), host, now)
            held_changed |= new.held != state.held
            self.levels[index] = new
            if change is not None:
                changes.append(change)
                self.pool.set_limit(index, change.new)
                # the next GPU's decision sees this one's trials
                host = replace(host, concurrency=self.pool.concurrency)
        for change in changes:
            self._changes.append({"time": datetime.now(UTC).isoformat(timespec="seconds"),
                                  "gpu": change.gpu, "from": change.old, "to": change.new,
                                  "reason": change.reason})
        if changes or (held_changed and now - self._written_at >= _HELD_WRITE_EVERY_S):
            self._write()
        return bool(changes)

    def close(self) -> None:
        """The final levels and why each stopped where it did."""
        if self.pool.auto:
            self._write()

    def _observe(self, state: GpuLevel, now: float) -> GpuObservation:
        index = state.gpu
        readings = [] if self.sampler is None else self.sampler.device_readings(index, state.since)
        utils = [r.sm_util for r in readings if r.sm_util is not None]
        latest = [] if self.sampler is None else self.sampler.device_readings(index, now - 30.0)
        used = next((r.mem_used_mib for r in reversed(latest) if r.mem_used_mib is not None), None)
        total = self._total_mib.get(index)
        ended = [e for e in self._ended[index] if e.spawned >= state.since]
        return GpuObservation(
            gpu=index, running=self.pool.busy_on(index),
            util=sum(utils) / len(utils) if utils else None, readings=len(utils),
            free_mib=None if used is None or total is None else total - used,
            running_mem_mib=tuple(self.sampler.running_mem_peaks(index)) if self.sampler else (),
            durations_s=tuple(e.duration_s for e in ended if not e.failed),
            # an OOM counts against the level in force when the trial ended
            ooms=sum(1 for e in self._ended[index] if e.oom and e.ended >= state.since))

    def _write(self) -> None:
        self._written_at = time.monotonic()
        value = {**self._record,
                 "levels": [{"gpu": s.gpu, "limit": s.limit, "held": s.held,
                             "rates": {str(k): v for k, v in sorted(s.rates.items())}}
                            for s in self.levels.values()],
                 "changes": self._changes[-_MAX_CHANGES:]}
        self.study.set_user_attr(packing_key(self.host), value)
