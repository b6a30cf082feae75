"""The telemetry sampler: a thread that reads the GPUs and each trial's process tree.

Every ``interval_s`` it reads NVML (or the fake backend) once per GPU that runs a trial,
and psutil once per trial's process tree, and attributes the readings to the trial on each
slot. Rows are buffered here; the orchestrator's loop writes them (it is the one storage
writer of this host). Aggregates are kept as running sums per trial and per phase.

Every trial gets samples, however short (a pruned trial can be shorter than the interval):
its first sample comes ``_FIRST_SAMPLE_S`` after it starts rather than at the next
round, and a trial that ends with no CPU reading yet is sampled once more as it ends (its
process still lives in reuse mode). A reused process's CPU baseline is read when the trial
starts, so even that first sample has a CPU %.

The readings of each GPU, and the host cores all watched trials used in each round, are also
kept for a while (:meth:`device_readings`, :meth:`cpu_readings`), for
``scheduler.trials_per_gpu=auto`` (placement/_packer.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psutil

from hpo_orchestrator.gpu import GpuBackend, GpuSample
from hpo_orchestrator.telemetry._aggregate import TrialTelemetry

__all__ = ["DeviceReading", "TelemetrySampler"]

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
    watched_at: float = 0.0


_RESCAN_ROUNDS = 10  # rounds between two scans of the process table for new children
# A new trial's first sample, this long after it starts (or at the interval if shorter): late
# enough that its process has begun, early enough to catch a trial pruned in its first step.
_FIRST_SAMPLE_S = 0.1
_DEVICE_READINGS = 4096  # readings kept per GPU for the packer (about an hour at 1 Hz)


@dataclass(frozen=True)
class DeviceReading:
    """One reading of a GPU while trials of ours ran on it."""

    t: float  # time.monotonic()
    sm_util: float | None
    mem_used_mib: float | None


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
        self._wake = threading.Event()  # a trial was watched: its first sample is due soon
        self._last_round = -math.inf
        self._device: dict[int, deque[DeviceReading]] = {}
        self._cpu: deque[tuple[float, float]] = deque(maxlen=_DEVICE_READINGS)  # (t, cores)
        self.cpu_seconds = 0.0  # the sampler thread's own CPU time (its overhead)
        self.samples_taken = 0

    # --- called from the orchestrator's loop ---------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s + 5)

    def watch(self, slot_id: int, trial_id: int, pid: int, gpu_index: int | None,
              fresh: bool = True) -> None:
        """Attribute the slot's samples to this trial from now on.

        ``fresh``: the process was started for this trial, so it has used no CPU yet and the
        first sample's CPU % is measured from its birth. A reused process (reuse mode) has a
        CPU history: its CPU time so far is read now, as the baseline (a few /proc reads).
        """
        cpu_s: float | None = 0.0
        if not fresh:
            tree = self._trees.get(pid) or _tree(pid, {})
            cpu_s = _tree_usage(tree)[0] if tree else None
        now = time.monotonic()
        with self._lock:
            self._watched[slot_id] = _Watched(slot_id, trial_id, pid, gpu_index,
                                              TrialTelemetry(on_gpu=gpu_index is not None),
                                              phase_since=now,
                                              last_sample_at=now if cpu_s is not None else None,
                                              last_cpu_s=cpu_s, watched_at=now)
        self._wake.set()

    def set_phase(self, slot_id: int, phase: str | None) -> None:
        now = time.monotonic()
        with self._lock:
            watched = self._watched.get(slot_id)
            if watched is not None:
                watched.telemetry.add_phase_time(watched.phase, now - watched.phase_since)
                watched.phase, watched.phase_since = phase, now

    def unwatch(self, slot_id: int) -> TrialTelemetry | None:
        """Stop sampling the slot's trial; its telemetry. A trial with no CPU reading yet
        (shorter than the first sample) is sampled now, while its process still lives."""
        with self._lock:
            watched = self._watched.get(slot_id)
        if watched is not None and watched.telemetry.overall.cpu_n == 0:
            try:
                self._sample(watched, only_this=True)
            except Exception:  # telemetry must never stop the scheduler
                pass
        now = time.monotonic()
        with self._lock:
            watched = self._watched.pop(slot_id, None)
        if watched is None:
            return None
        watched.telemetry.add_phase_time(watched.phase, now - watched.phase_since)
        return watched.telemetry

    def device_readings(self, gpu_index: int, since: float) -> list[DeviceReading]:
        """The GPU's readings taken at or after ``since`` (time.monotonic()), oldest first."""
        with self._lock:
            readings = list(self._device.get(gpu_index, ()))
        return [r for r in readings if r.t >= since]

    def cpu_readings(self, since: float) -> list[float]:
        """Cores used by all watched trials together in each full round at or after ``since``
        (a round where a trial had no CPU reading yet is left out)."""
        with self._lock:
            readings = list(self._cpu)
        return [cores for t, cores in readings if t >= since]

    def running_mem_peaks(self, gpu_index: int) -> list[float]:
        """Peak GPU memory seen so far of each trial running on the GPU (MiB)."""
        with self._lock:
            return [w.telemetry.overall.gpu_mem_peak for w in self._watched.values()
                    if w.gpu_index == gpu_index and w.telemetry.overall.gpu_mem_peak is not None]

    def take_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    # --- the sampling thread -------------------------------------------------------------

    def _loop(self) -> None:
        started_cpu = time.thread_time()
        while not self._stop.is_set():
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if time.monotonic() - self._last_round >= self.interval_s * 0.999:
                    self.sample_once()
                else:
                    self._sample_new()
            except Exception:  # telemetry must never stop the scheduler
                pass
            self.cpu_seconds = time.thread_time() - started_cpu

    def _first_delay(self) -> float:
        return min(_FIRST_SAMPLE_S, self.interval_s)

    def _next_wait(self) -> float:
        """Seconds to the next round, or to the first sample of a trial that has none."""
        now = time.monotonic()
        due = self._last_round + self.interval_s
        with self._lock:
            for w in self._watched.values():
                if w.telemetry.overall.samples == 0:
                    due = min(due, w.watched_at + self._first_delay())
        return max(0.0, due - now)

    def _sample_new(self) -> None:
        """The first sample of trials watched at least _FIRST_SAMPLE_S ago (not yet sampled)."""
        now = time.monotonic()
        with self._lock:
            new = [w for w in self._watched.values() if w.telemetry.overall.samples == 0
                   and now - w.watched_at >= self._first_delay() * 0.999]
        for w in new:
            self._sample(w, only_this=True)

    def sample_once(self) -> None:
        """One round: every watched trial."""
        self._last_round = time.monotonic()
        with self._lock:
            watched = list(self._watched.values())
        if watched:
            self._sample_all(watched)

    def _sample(self, w: _Watched, only_this: bool) -> None:
        self._sample_all([w], only_this=only_this)

    def _sample_all(self, watched: list[_Watched], only_this: bool = False) -> None:
        """One sample of each of ``watched``: the GPUs they run on, then each trial's process
        tree. ``only_this``: a trial's own first or last sample between rounds (not a round:
        no rescan of the process table, no round's CPU total)."""
        with self._lock:
            sharing = Counter(w.gpu_index for w in self._watched.values() if w.gpu_index is not None)
        gpu_samples, now = self._read_gpus({w.gpu_index for w in watched if w.gpu_index is not None})
        ts = datetime.now(UTC).replace(tzinfo=None)
        self._refresh_trees(watched, rescan=not only_this and self._round % _RESCAN_ROUNDS == 0)
        if not only_this:
            self._round += 1
        rows = []
        for w in watched:
            read = self._read_tree(w, gpu_samples, ts, now)
            if read is None:
                continue  # exited; its trial is about to be finished by the orchestrator
            row, cpu_s = read
            dt = self.interval_s if w.last_sample_at is None else now - w.last_sample_at
            with self._lock:
                if self._watched.get(w.slot_id) is w:  # not finished meanwhile
                    share = max(sharing[w.gpu_index], 1) if w.gpu_index is not None else 1
                    w.telemetry.add(row, dt, share)
                    w.last_cpu_s, w.last_sample_at = cpu_s, now
                    rows.append(row)
        self._keep_rows(rows, now, round_=not only_this)

    def _read_gpus(self, indices: set[int]) -> tuple[dict[int, GpuSample | None], float]:
        """One reading of each GPU, kept for the packer (device_readings), and the time."""
        samples = {index: self.backend.sample(index) for index in indices}
        now = time.monotonic()
        with self._lock:
            for index, sample in samples.items():
                if sample is not None:
                    self._device.setdefault(index, deque(maxlen=_DEVICE_READINGS)).append(
                        DeviceReading(now, sample.sm_util, sample.mem_used_mib))
        return samples, now

    def _refresh_trees(self, watched: list[_Watched], rescan: bool) -> None:
        """Trees are re-read every few rounds, and at once for a new trial: children
        (DataLoader workers) live long; the CPU time of one that exits in between still
        counts, in its parent's children_* times. A rescan forgets the trees of processes
        that ended (retired workers)."""
        stale = [w for w in watched if w.pid not in self._trees or rescan]
        if stale:
            children = _children_map()
            for w in stale:
                self._trees[w.pid] = _tree(w.pid, children)
        if rescan:
            for pid, tree in list(self._trees.items()):
                if not tree or not tree[0].is_running():
                    self._trees.pop(pid, None)

    def _read_tree(self, w: _Watched, gpu_samples: dict[int, GpuSample | None], ts: datetime,
                   now: float) -> tuple[dict[str, Any], float] | None:
        """The trial's row (its process tree's CPU and memory, its GPU's columns) and the
        tree's CPU seconds so far; None when its processes are gone."""
        processes = [p for p in self._trees.get(w.pid, []) if p.is_running()]
        if not processes:
            return None
        cpu_s, rss_mib = _tree_usage(processes)
        cpu_util = None
        if w.last_cpu_s is not None and w.last_sample_at is not None and now > w.last_sample_at:
            cpu_util = round(max(0.0, cpu_s - w.last_cpu_s) / (now - w.last_sample_at) * 100, 1)
        gpu = gpu_samples.get(w.gpu_index) if w.gpu_index is not None else None
        return {"trial_id": w.trial_id, "ts": ts, "gpu_index": w.gpu_index, "phase": w.phase,
                "cpu_util": cpu_util, "rss_mib": round(rss_mib, 1),
                **_gpu_columns(gpu, {p.pid for p in processes})}, cpu_s

    def _keep_rows(self, rows: list[dict[str, Any]], now: float, round_: bool) -> None:
        """Buffer the rows for the loop; a round where every trial had a CPU reading adds the
        host cores they used together (cpu_readings)."""
        with self._lock:
            self._rows.extend(rows)
            if round_:
                self.samples_taken += 1
                if rows and all(r["cpu_util"] is not None for r in rows):
                    self._cpu.append((now, sum(r["cpu_util"] for r in rows) / 100.0))


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
