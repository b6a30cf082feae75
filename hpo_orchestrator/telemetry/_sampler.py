"""The telemetry sampler: a thread that reads the GPUs and each trial's process tree.

Every ``interval_s`` it reads NVML (or the fake backend) once per GPU that runs a trial,
and psutil once per trial's process tree, and attributes the readings to the trial on each
slot. Rows are buffered here; the orchestrator's loop writes them (it is the one storage
writer of this host). Aggregates are kept as running sums per trial and per phase.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psutil

from hpo_orchestrator.gpu import GpuBackend, GpuSample
from hpo_orchestrator.telemetry._aggregate import TrialTelemetry

__all__ = ["TelemetrySampler"]

_MIB = 1024 * 1024


@dataclass
class _Watched:
    slot_id: int
    trial_id: int
    pid: int
    gpu_index: int | None
    telemetry: TrialTelemetry
    phase: str | None = None
    phase_since: float = 0.0
    last_sample_at: float | None = None
    last_cpu_s: float | None = None


_RESCAN_ROUNDS = 10  # rounds between two scans of the process table for new children


def _children_map() -> dict[int, list[psutil.Process]]:
    """parent pid -> child processes, from one scan of the process table (~10 ms on a host
    with 100 processes: the sampler's largest cost, so it is not done every round)."""
    children: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info["ppid"]
        if ppid is not None:
            children.setdefault(ppid, []).append(proc)
    return children


def _tree(pid: int, children: dict[int, list[psutil.Process]]) -> list[psutil.Process]:
    try:
        tree, todo = [psutil.Process(pid)], [pid]
    except psutil.Error:
        return []
    while todo:
        for child in children.get(todo.pop(), []):
            tree.append(child)
            todo.append(child.pid)
    return tree


def _tree_usage(processes: list[psutil.Process]) -> tuple[float, float]:
    """(CPU seconds used so far, RSS MiB) summed over a process tree."""
    cpu_s = rss = 0.0
    for proc in processes:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu_s += times.user + times.system + times.children_user + times.children_system
                rss += proc.memory_info().rss
        except psutil.Error:
            continue  # it exited between the listing and the read
    return cpu_s, rss / _MIB


class TelemetrySampler:
    """Start with :meth:`start`; :meth:`watch` a slot's trial at spawn, :meth:`unwatch` at end."""

    def __init__(self, backend: GpuBackend, interval_s: float) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self._watched: dict[int, _Watched] = {}  # slot id -> trial
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpo-telemetry", daemon=True)
        self._trees: dict[int, list[psutil.Process]] = {}  # trial pid -> its process tree
        self._round = 0
        self.cpu_seconds = 0.0  # the sampler thread's own CPU time (its overhead)
        self.samples_taken = 0

    # --- called from the orchestrator's loop ---------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s + 5)

    def watch(self, slot_id: int, trial_id: int, pid: int, gpu_index: int | None,
              fresh: bool = True) -> None:
        """Attribute the slot's samples to this trial from now on.

        ``fresh``: the process was started for this trial, so it has used no CPU yet and the
        first sample's CPU % is measured from its birth. A reused process (reuse mode) has a
        CPU history: its first sample only sets the baseline.
        """
        with self._lock:
            now = time.monotonic()
            self._watched[slot_id] = _Watched(slot_id, trial_id, pid, gpu_index,
                                              TrialTelemetry(on_gpu=gpu_index is not None),
                                              phase_since=now,
                                              last_sample_at=now if fresh else None,
                                              last_cpu_s=0.0 if fresh else None)

    def set_phase(self, slot_id: int, phase: str | None) -> None:
        now = time.monotonic()
        with self._lock:
            watched = self._watched.get(slot_id)
            if watched is not None:
                watched.telemetry.add_phase_time(watched.phase, now - watched.phase_since)
                watched.phase, watched.phase_since = phase, now

    def unwatch(self, slot_id: int) -> TrialTelemetry | None:
        now = time.monotonic()
        with self._lock:
            watched = self._watched.pop(slot_id, None)
        if watched is None:
            return None
        self._trees.pop(watched.pid, None)
        watched.telemetry.add_phase_time(watched.phase, now - watched.phase_since)
        return watched.telemetry

    def take_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    # --- the sampling thread -------------------------------------------------------------

    def _loop(self) -> None:
        started_cpu = time.thread_time()
        while not self._stop.wait(self.interval_s):
            try:
                self.sample_once()
            except Exception:  # telemetry must never stop the scheduler
                pass
            self.cpu_seconds = time.thread_time() - started_cpu

    def sample_once(self) -> None:
        with self._lock:
            watched = list(self._watched.values())
        if not watched:
            return
        on_gpu: dict[int, int] = {}
        for w in watched:
            if w.gpu_index is not None:
                on_gpu[w.gpu_index] = on_gpu.get(w.gpu_index, 0) + 1
        gpu_samples = {index: self.backend.sample(index) for index in on_gpu}
        now = time.monotonic()
        ts = datetime.now(UTC).replace(tzinfo=None)
        # Trees are re-read every few rounds, and at once for a new trial: children (DataLoader
        # workers) live long; the CPU time of one that exits in between still counts, in its
        # parent's children_* times.
        stale = [w for w in watched if w.pid not in self._trees or self._round % _RESCAN_ROUNDS == 0]
        if stale:
            children = _children_map()
            for w in stale:
                self._trees[w.pid] = _tree(w.pid, children)
        self._round += 1
        rows = []
        for w in watched:
            processes = [p for p in self._trees.get(w.pid, []) if p.is_running()]
            if not processes:
                continue  # exited; its trial is about to be finished by the orchestrator
            cpu_s, rss_mib = _tree_usage(processes)
            cpu_util = None
            if w.last_cpu_s is not None and w.last_sample_at is not None and now > w.last_sample_at:
                cpu_util = round(max(0.0, cpu_s - w.last_cpu_s) / (now - w.last_sample_at) * 100, 1)
            dt = self.interval_s if w.last_sample_at is None else now - w.last_sample_at
            row = {"trial_id": w.trial_id, "ts": ts, "gpu_index": w.gpu_index, "phase": w.phase,
                   "cpu_util": cpu_util, "rss_mib": round(rss_mib, 1),
                   **_gpu_columns(gpu_samples.get(w.gpu_index) if w.gpu_index is not None else None,
                                  {p.pid for p in processes})}
            with self._lock:
                if self._watched.get(w.slot_id) is w:  # not finished meanwhile
                    w.telemetry.add(row, dt, on_gpu.get(w.gpu_index, 1) if w.gpu_index is not None else 1)
                    w.last_cpu_s, w.last_sample_at = cpu_s, now
                    rows.append(row)
        with self._lock:
            self._rows.extend(rows)
            self.samples_taken += 1


def _gpu_columns(sample: GpuSample | None, pids: set[int]) -> dict[str, Any]:
    if sample is None:
        return {"sm_util": None, "mem_used_mib": None, "power_w": None, "temp_c": None,
                "proc_sm_util": None, "proc_mem_mib": None}
    ours = [usage for pid, usage in sample.processes.items() if pid in pids]
    sm = [u[0] for u in ours if u[0] is not None]
    mem = [u[1] for u in ours if u[1] is not None]
    return {
        "sm_util": sample.sm_util,
        "mem_used_mib": None if sample.mem_used_mib is None else round(sample.mem_used_mib, 1),
        "power_w": None if sample.power_w is None else round(sample.power_w, 1),
        "temp_c": sample.temp_c,
        "proc_sm_util": sum(sm) if sm else None,
        # 0.0, not None, when the driver lists the process without its memory: it was seen.
        "proc_mem_mib": round(sum(mem), 1) if mem else (0.0 if ours else None),
    }
