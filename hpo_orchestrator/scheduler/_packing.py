"""``scheduler.trials_per_gpu=auto``: how many trials each GPU runs at once (pure rules).

Issue 17 measured it on one H100: the same trials ran 1.66-1.97x faster at two per GPU than
at one, because each left the GPU mostly idle (1-30 % utilization), and slower again at four
for one workload: a fixed guess can lose the gain. So each GPU gets a *level* (trials at
once) that this module moves one step at a time, from what was measured:

- up, while the GPU's utilization at the current level stays under ``target_util``, the next
  trial's expected peak memory (with margin) fits in the GPU's free memory, the host has a
  core for one more trial, and the current level's throughput is known (so the next level can
  be judged against it);
- down, and never up again in this run (``ceiling``), when a level did not raise the trials
  finished per minute by ``min_gain`` over the level below, or when a trial ran out of memory.

Throughput at a level is measured from the trials that ran wholly at it (started after the
level was set): ``level * 60 / mean duration``, trials per minute with the GPU full. Each
finished trial is one measurement, so a level is judged after a few trials instead of a long
window of finishes, and trials of different kinds (a LightGBM one, a torch one) weigh alike
at every level.

Everything here is a function of its inputs (no clock, no I/O), so the tests drive it with
scripted numbers; scheduler/_packer.py gathers the inputs and applies the outputs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

__all__ = ["Change", "GpuLevel", "GpuObservation", "HostObservation", "PackingPolicy", "decide",
           "expected_peak_mib"]

TRIALS_PER_LEVEL = 2  # trials that ran wholly at a level before its throughput counts


@dataclass(frozen=True)
class PackingPolicy:
    # 80 %: one more trial can raise a GPU's throughput by at most 100 / util, 1.25x at 80 %,
    # which the extra trial's start-up, memory and contention eat; the trials of issue 17
    # (1-30 %) gained 1.66-1.97x from a second trial. docs/DESIGN.md §3.7.
    target_util: float = 80.0
    max_per_gpu: int = 4
    mem_margin: float = 1.25  # the next trial's expected peak memory times this ...
    mem_reserve_mib: float = 512.0  # ... plus this (CUDA context, allocator slack) must be free
    min_gain: float = 0.05  # a level must finish this share more trials per minute than the one below
    min_readings: int = 3  # GPU readings at a level before its utilization counts


@dataclass(frozen=True)
class GpuLevel:
    """One GPU's state between decisions."""

    gpu: int
    limit: int = 1  # trials at once now
    since: float = 0.0  # when ``limit`` was set (the caller's clock)
    ceiling: int = 1  # highest level allowed from now on
    rates: dict[int, float] = field(default_factory=dict)  # level -> trials per minute
    held: str | None = None  # why it does not go up now (None: nothing holds it)


@dataclass(frozen=True)
class GpuObservation:
    """What was measured on one GPU since its level was set."""

    gpu: int
    running: int  # trials of this orchestrator on it now
    util: float | None  # mean SM % of the GPU over the readings since the level was set
    readings: int
    free_mib: float | None  # memory free on the GPU now
    running_mem_mib: tuple[float, ...] = ()  # peak so far of each trial running on it
    durations_s: tuple[float, ...] = ()  # trials that started and ended at this level
    ooms: int = 0  # trials on it that ran out of memory since the level was set


@dataclass(frozen=True)
class HostObservation:
    cores: int  # CPU cores this orchestrator may use
    concurrency: int  # trials at once now, over every GPU (the sum of the levels, capped)
    cap: int  # scheduler.parallel: the most trials at once
    mem_peak_mib: float | None  # expected peak GPU memory of the next trial (expected_peak_mib)


@dataclass(frozen=True)
class Change:
    gpu: int
    old: int
    new: int
    reason: str


def expected_peak_mib(finished: list[float], running: list[float]) -> float | None:
    """The next trial's expected peak GPU memory: the largest peak of finished trials (the
    median would let every other trial out-grow its place), or of running ones when no trial
    has finished yet."""
    known = finished or running
    return max(known) if known else None


def _rate(level: int, durations: tuple[float, ...]) -> float | None:
    if len(durations) < TRIALS_PER_LEVEL:
        return None
    mean = statistics.fmean(durations)
    return level * 60.0 / mean if mean > 0 else None


def decide(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
           host: HostObservation, now: float) -> tuple[GpuLevel, Change | None]:
    """The GPU's next state, and the change of its level if there is one (with its reason)."""
    level = state.limit
    if obs.ooms:
        state = replace(state, ceiling=max(1, level - 1))
        if level > 1:
            return _move(state, level - 1, now, f"a trial ran out of GPU memory at {level} per GPU")
        return replace(state, held="a trial ran out of GPU memory at 1 per GPU"), None

    rate = _rate(level, obs.durations_s)  # refined with every trial that ends at this level
    if rate is not None:
        state = replace(state, rates={**state.rates, level: round(rate, 2)})
    below = state.rates.get(level - 1)
    if rate is not None and below is not None and rate < below * (1 + policy.min_gain):
        state = replace(state, ceiling=level - 1)
        return _move(state, level - 1, now,
                     f"{level} per GPU finished {rate:.1f} trials/min, {level - 1} per GPU "
                     f"{below:.1f}: no gain")

    held = _held(policy, state, obs, host)
    if held is not None:
        return replace(state, held=held), None
    assert obs.util is not None  # _held checked it
    return _move(state, level + 1, now,
                 f"{obs.util:.0f}% utilization < {policy.target_util:g}% at {level} per GPU "
                 f"({state.rates[level]:.1f} trials/min)")


def _move(state: GpuLevel, new: int, now: float, reason: str) -> tuple[GpuLevel, Change]:
    change = Change(state.gpu, state.limit, new, reason)
    return replace(state, limit=new, since=now, held=None), change


def _held(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
          host: HostObservation) -> str | None:
    """Why the GPU does not get one more trial now; None when it may."""
    level = state.limit
    if level >= min(state.ceiling, policy.max_per_gpu):
        return (f"at scheduler.max_trials_per_gpu={policy.max_per_gpu}"
                if level >= policy.max_per_gpu else f"{state.ceiling} per GPU was the best level")
    if host.concurrency >= host.cap:
        return f"at scheduler.parallel={host.cap} trials on this host"
    if host.concurrency + 1 > host.cores:
        return f"no CPU core for one more trial ({host.cores} cores, {host.concurrency} trials)"
    if obs.running < level:  # another place would idle too; the last real reason still holds
        return state.held or f"{obs.running} of its {level} places busy"
    if obs.util is None or obs.readings < policy.min_readings:
        return "measuring utilization"
    if obs.util >= policy.target_util:
        return f"{obs.util:.0f}% utilization >= scheduler.target_gpu_util={policy.target_util:g}"
    if level not in state.rates:
        return f"measuring throughput at {level} per GPU"
    if host.mem_peak_mib is None or obs.free_mib is None:
        return "GPU memory unknown"
    # Running trials may still grow to the expected peak: their growth is set aside too.
    growth = sum(max(0.0, host.mem_peak_mib - used) for used in obs.running_mem_mib)
    need = host.mem_peak_mib * policy.mem_margin + policy.mem_reserve_mib
    if obs.free_mib - growth < need:
        return (f"GPU memory: {obs.free_mib - growth:.0f} MiB free, a trial needs "
                f"{need:.0f} MiB (peak {host.mem_peak_mib:.0f} MiB x {policy.mem_margin:g} "
                f"+ {policy.mem_reserve_mib:g})")
    return None
