"""Per-trial aggregates of telemetry samples: what becomes the trial's ``hpo.*`` user attrs.

Phase-aware on purpose: a 0 % GPU reading while the objective loads data is expected, the
same reading while it trains is a finding. Samples taken while no phase was marked count as
compute time only for objectives that never mark a phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hpo_orchestrator import keys

__all__ = ["PhaseStats", "TrialTelemetry"]

UNMARKED = "unmarked"
# NVML's utilization readings cover a window before the read (up to 1 s: 1/6 s to 1 s by
# product, nvmlDeviceGetUtilizationRates; per-process samples are buffered likewise), so the
# first readings after a phase starts can show the previous phase's kernels. Measured on an
# H100 (docs/GPU.md): a process that made one small kernel and then idled through its
# `train` phase read as working from those first samples alone.
NVML_WINDOW_S = 1.0


def _mean(total: float, count: int) -> float | None:
    return round(total / count, 2) if count else None


@dataclass
class PhaseStats:
    """Running sums for one phase (or the whole trial); no per-sample list is kept."""

    samples: int = 0
    gpu_util_sum: float = 0.0
    gpu_util_n: int = 0
    gpu_util_max: float | None = None
    proc_util_sum: float = 0.0
    proc_util_n: int = 0
    proc_util_max: float | None = None
    power_sum: float = 0.0
    power_n: int = 0
    energy_j: float = 0.0
    cpu_sum: float = 0.0
    cpu_n: int = 0
    gpu_mem_peak: float | None = None
    rss_peak: float | None = None

    def add(self, row: dict[str, Any], dt: float, gpu_share: int) -> None:
        self.samples += 1
        util = row.get("sm_util")
        if util is not None:
            self.gpu_util_sum += util
            self.gpu_util_n += 1
            self.gpu_util_max = util if self.gpu_util_max is None else max(self.gpu_util_max, util)
        proc_util = row.get("proc_sm_util")
        if proc_util is not None:
            self.proc_util_sum += proc_util
            self.proc_util_n += 1
            self.proc_util_max = max(self.proc_util_max or 0.0, proc_util)
        power = row.get("power_w")
        if power is not None:
            self.power_sum += power
            self.power_n += 1
            # The card's energy over the interval, split among the trials sharing it.
            self.energy_j += power * dt / max(gpu_share, 1)
        if row.get("cpu_util") is not None:
            self.cpu_sum += row["cpu_util"]
            self.cpu_n += 1
        mem = row.get("proc_mem_mib") if row.get("proc_mem_mib") is not None else row.get("mem_used_mib")
        if mem is not None:
            self.gpu_mem_peak = mem if self.gpu_mem_peak is None else max(self.gpu_mem_peak, mem)
        rss = row.get("rss_mib")
        if rss is not None:
            self.rss_peak = rss if self.rss_peak is None else max(self.rss_peak, rss)

    @property
    def gpu_util_mean(self) -> float | None:
        return _mean(self.gpu_util_sum, self.gpu_util_n)

    @property
    def proc_util_mean(self) -> float | None:
        return _mean(self.proc_util_sum, self.proc_util_n)

    @property
    def cpu_util_mean(self) -> float | None:
        return _mean(self.cpu_sum, self.cpu_n)


@dataclass
class TrialTelemetry:
    """Everything measured for one trial while it ran."""

    on_gpu: bool
    overall: PhaseStats = field(default_factory=PhaseStats)
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    marked_phases: bool = False
    alone_on_gpu: bool = True  # False once a sample saw another trial on the same GPU
    # Per phase, the samples taken past NVML's window after the phase began: the evidence
    # for gpu_verified (their readings cannot include another phase's work).
    settled: dict[str, PhaseStats] = field(default_factory=dict)
    _phase: str | None = None
    _phase_floor: datetime | None = None  # the last sample before the current phase
    _last_ts: datetime | None = None

    def add(self, row: dict[str, Any], dt: float, gpu_share: int) -> None:
        phase = row.get("phase") or UNMARKED
        self.overall.add(row, dt, gpu_share)
        self.phases.setdefault(phase, PhaseStats()).add(row, dt, gpu_share)
        if gpu_share > 1:
            self.alone_on_gpu = False
        ts = row.get("ts")
        if phase != self._phase:
            self._phase, self._phase_floor = phase, self._last_ts
        if not isinstance(ts, datetime) or self._phase_floor is None \
                or (ts - self._phase_floor).total_seconds() > NVML_WINDOW_S:
            self.settled.setdefault(phase, PhaseStats()).add(row, dt, gpu_share)
        self._last_ts = ts if isinstance(ts, datetime) else None

    def add_phase_time(self, phase: str | None, seconds: float) -> None:
        key = phase or UNMARKED
        if phase is not None:
            self.marked_phases = True
        self.phase_seconds[key] = self.phase_seconds.get(key, 0.0) + seconds

    def compute(self, compute_phases: list[str], settled: bool = False) -> PhaseStats:
        """The samples taken while the trial did its real work (``settled``: only those past
        NVML's window after their phase began)."""
        phases = self.settled if settled else self.phases
        if not self.marked_phases:
            return phases.get(UNMARKED, PhaseStats()) if settled else self.overall
        merged = PhaseStats()
        for name, stats in phases.items():
            if name in compute_phases:
                for key, value in vars(stats).items():
                    _merge(merged, key, value)
        return merged

    def gpu_verified(self, compute_phases: list[str]) -> bool | None:
        """Did the assigned GPU do this trial's work? None when the evidence cannot tell.

        NVML gives a process a utilization sample only when it ran kernels since the last
        query (nvmlDeviceGetProcessUtilization: no sample, or NOT_FOUND, for a process that
        holds a context and does nothing), so a process listed with memory but without a
        sample is idle, not "seen working". Hence:

        - yes if the driver gave one of the trial's processes a non-zero SM sample in compute;
        - no if the GPU read 0 % throughout compute, whether or not the process was listed
          (a CUDA context alone is the seed incident: a GPU "used" at 0 %);
        - yes if the GPU was busy while this trial ran on it alone;
        - otherwise (busy, shared, no sample of ours) the readings cannot tell whose work it was.

        Readings within NVML_WINDOW_S of a phase's start are left out where later ones exist.
        """
        if not self.on_gpu:
            return None
        compute = self.compute(compute_phases, settled=True)
        if compute.samples == 0:  # compute phases shorter than NVML's window: all we have
            compute = self.compute(compute_phases)
        if compute.samples == 0:
            return None
        if (compute.proc_util_max or 0) > 0:
            return True
        if compute.gpu_util_n == 0:
            return None
        if (compute.gpu_util_max or 0) == 0:
            return False
        return True if self.alone_on_gpu else None

    def attrs(self, compute_phases: list[str]) -> dict[str, Any]:
        """The trial's telemetry user attrs (absent metrics are left out, not written as 0)."""
        o = self.overall
        compute = self.compute(compute_phases)
        values: dict[str, Any] = {
            "hpo.telemetry_samples": o.samples,
            "hpo.cpu_util_mean": o.cpu_util_mean,
            "hpo.rss_peak_mib": _round(o.rss_peak),
        }
        if self.on_gpu:
            values.update({
                keys.GPU_UTIL_MEAN: o.gpu_util_mean,
                "hpo.gpu_util_max": o.gpu_util_max,
                keys.GPU_UTIL_COMPUTE_MEAN: compute.gpu_util_mean,
                "hpo.gpu_proc_util_mean": o.proc_util_mean,
                keys.GPU_MEM_PEAK_MIB: _round(o.gpu_mem_peak),
                "hpo.gpu_power_mean_w": _mean(o.power_sum, o.power_n),
                keys.GPU_ENERGY_J: round(o.energy_j, 1) if o.power_n else None,
                keys.GPU_VERIFIED: self.gpu_verified(compute_phases),
            })
        phases = {}
        for name in sorted(set(self.phases) | set(self.phase_seconds)):
            stats = self.phases.get(name, PhaseStats())
            entry = {"seconds": round(self.phase_seconds.get(name, 0.0), 3), "samples": stats.samples,
                     "cpu_util_mean": stats.cpu_util_mean}
            if self.on_gpu:
                entry["gpu_util_mean"] = stats.gpu_util_mean
                entry["gpu_util_max"] = stats.gpu_util_max
            phases[name] = entry
        if self.marked_phases:
            values["hpo.phases"] = phases
        return {k: v for k, v in values.items() if v is not None}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _merge(into: PhaseStats, key: str, value: Any) -> None:
    current = getattr(into, key)
    if key in ("gpu_util_max", "proc_util_max", "gpu_mem_peak", "rss_peak"):
        if value is not None:
            setattr(into, key, value if current is None else max(current, value))
    else:
        setattr(into, key, current + value)
