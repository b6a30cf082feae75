"""``scheduler.trials_per_gpu=auto``: how many trials each GPU runs at once (pure rules).

Issue 17 measured it on H100s: gpu_mix (LightGBM-GPU and torch trials) ran 2.1-2.3x faster at
three per GPU than at one, while the default LightGBM study ran 0.65x at two (its one trial
already keeps the host's cores busy; two OpenCL contexts time-slice the GPU). Utilization
alone cannot tell these apart (both left the GPU 8-30 % busy), so each GPU gets a *level*
(trials at once) that this module moves one step at a time, from what was measured:

- up, while the GPU's utilization at the current level stays under ``target_util``, the next
  trial's expected peak memory (with margin) fits in the GPU's free memory, the running
  trials leave the host's cores room (``cpu_full``), and the current level's trial durations
  are known (so the next level can be judged against them);
- down, and never up again in this run (``ceiling``), when a level did not raise the trials
  finished per minute by ``min_gain`` over the level below, or when a trial ran out of memory.

A level is judged by *trial durations per kind*: each trial that ran wholly at level k is
compared with the mean duration of trials of its kind (its categorical parameters: a
LightGBM trial with a LightGBM one) at the level below j, and the level's gain is
``k / j`` over the geometric mean of those slowdowns. A noisy trials/min of a few finishes,
or a different mix of kinds at two levels, would misjudge it. A worker's first trial (process
start, imports, LightGBM's OpenCL kernel build) is left out by the caller. A running trial
that is already slower than break-even counts too: a loss shows before the trial ends.

How many trials a verdict needs (runs D-G on H100s, docs/BENCHMARKS.md): one trial of a kind
varied 1.5x by what ran beside it, so one trial backs a level off for good only when it
shows a ``FAR_LOSS`` (or runs out of memory); "no gain" otherwise needs ``TRIALS_PER_LEVEL``
trials of one kind (LightGBM's 0.94x and 0.88x at two per GPU: back at once to one). A level
is climbed past only when it gained ``climb_gain`` over the level below: one that barely
gained (three per GPU at 1.06x of two) has filled the GPU, and each climb costs a new
worker's warm-up. Where the GPU is nearly idle with memory for two more trials
(``fast_util``), one trial is enough to climb on: at level 1, or when it shows a ``CLEAR``
gain. Only kinds measured at both levels are compared (scheduler/_trial_times.py folds a
study of many kinds into one).

Everything here is a function of its inputs (no clock, no I/O), so the tests drive it with
scripted numbers; scheduler/_packer.py gathers the inputs and applies the outputs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Change", "GpuLevel", "GpuObservation", "HostObservation", "PackingPolicy", "TrialTime",
           "decide", "expected_peak_mib", "trial_kind"]

TRIALS_PER_LEVEL = 2  # measured trials at a level (of one kind, for "no gain") before they count
CLEAR = 1.25  # a gain of this factor is clear from one trial on a nearly idle GPU
# A loss to this is clear from one trial: twice the 1.5x that one trial of a kind varied by
# its neighbours in run F, where one trial at 0.74x ended a level that gained 1.45x elsewhere.
FAR_LOSS = 0.5
POOLED = "*"  # kind of every trial, where no kind ran at both levels


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
    # Trials using this share of the host's cores leave none for one more: it would only
    # split the same cores (LightGBM at 16 threads on 16 cores), whatever the GPU says.
    cpu_full: float = 0.85
    fast_util: float = 0.5  # under target_util x this (and memory for two more): climb on one trial
    # A level that gained less than this over the one below is kept, not climbed past: the
    # next level gains less still (run A: 1.62x, 1.27x, then 0.89x a level), it costs a new
    # worker's warm-up (about 25 s on gpu_mix), and one run's noise was about 15 %.
    climb_gain: float = 1.15


@dataclass(frozen=True)
class TrialTime:
    """One trial that ran at the GPU's current level (not its worker's first)."""

    kind: str
    seconds: float
    running: bool = False  # still running: ``seconds`` so far, a lower bound


@dataclass(frozen=True)
class GpuLevel:
    """One GPU's state between decisions."""

    gpu: int
    limit: int = 1  # trials at once now
    since: float = 0.0  # when ``limit`` was set (the caller's clock)
    ceiling: int = 1  # highest level allowed from now on
    times: dict[int, dict[str, tuple[float, ...]]] = field(default_factory=dict)  # level -> kind -> s
    rates: dict[int, float] = field(default_factory=dict)  # level -> trials per minute (shown)
    gains: dict[int, float] = field(default_factory=dict)  # level -> throughput / level below's
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
    trials: tuple[TrialTime, ...] = ()  # trials spawned at this level (finished and running)
    ooms: int = 0  # trials on it that ran out of memory since the level was set
    cpu_cores: float | None = None  # host cores our running trials used since the level was set


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


def trial_kind(params: Mapping[str, Any]) -> str:
    """What makes trials comparable: their categorical parameters (gpu_mix's ``kind``, a
    model family). Numbers vary from trial to trial and are left out."""
    parts = [f"{k}={v}" for k, v in sorted(params.items()) if isinstance(v, (str, bool))]
    return ",".join(parts) or POOLED


def expected_peak_mib(finished: list[float], running: list[float]) -> float | None:
    """The next trial's expected peak GPU memory: the largest peak of finished trials (the
    median would let every other trial out-grow its place), or of running ones when no trial
    has finished yet."""
    known = finished or running
    return max(known) if known else None


@dataclass(frozen=True)
class _Gain:
    ratio: float  # throughput at the level / throughput at the level below
    trials: int  # trials it rests on
    of_one_kind: int  # the most of them of one kind


def _gain(level: int, trials: tuple[TrialTime, ...], below: int,
          base: dict[str, tuple[float, ...]]) -> _Gain | None:
    """The level's gain over ``below`` from its trials compared with their kind there, or None."""
    # Only kinds measured at both levels: a LightGBM trial of 4 s against torch trials of 8 s
    # would read as a gain, the other way round as a loss.
    means = {kind: statistics.fmean(s) for kind, s in base.items() if s}
    same_kind = [t for t in trials if t.kind in means]
    break_even = level / below
    logs = []
    kinds: dict[str, int] = {}
    for t in same_kind:
        slowdown = t.seconds / means[t.kind]
        # A running trial proves a loss only once it is past break-even; before, it proves nothing.
        if not t.running or slowdown > break_even:
            logs.append(math.log(max(slowdown, 1e-9)))
            kinds[t.kind] = kinds.get(t.kind, 0) + 1
    if not logs:
        return None
    return _Gain(break_even / math.exp(statistics.fmean(logs)), len(logs), max(kinds.values()))


def decide(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
           host: HostObservation, now: float) -> tuple[GpuLevel, Change | None]:
    """The GPU's next state, and the change of its level if there is one (with its reason)."""
    level = state.limit
    if obs.ooms:
        state = replace(state, ceiling=max(1, level - 1))
        if level > 1:
            return _move(state, level - 1, now, f"a trial ran out of GPU memory at {level} per GPU")
        return replace(state, held="a trial ran out of GPU memory at 1 per GPU"), None

    finished: dict[str, tuple[float, ...]] = {}
    for t in obs.trials:
        if not t.running:
            finished[t.kind] = (*finished.get(t.kind, ()), t.seconds)
    if finished:  # refined with every trial that ends at this level
        mean = statistics.fmean(s for durations in finished.values() for s in durations)
        state = replace(state, times={**state.times, level: finished},
                        rates={**state.rates, level: round(level * 60.0 / mean, 2)})
    below = max((k for k in state.times if k < level), default=None)
    gain = None if below is None else _gain(level, obs.trials, below, state.times[below])
    if gain is not None:
        assert below is not None
        state = replace(state, gains={**state.gains, level: round(gain.ratio, 2)})
        if gain.ratio < FAR_LOSS or (gain.of_one_kind >= TRIALS_PER_LEVEL
                                     and gain.ratio < 1 + policy.min_gain):
            state = replace(state, ceiling=level - 1)
            return _move(state, level - 1, now,
                         f"{level} per GPU finished {gain.ratio:.2f}x the trials/min of {below} "
                         f"per GPU ({gain.trials} trials compared with their kind): no gain")

    held = _held(policy, state, obs, host, gain, below)
    if held is not None:
        return replace(state, held=held), None
    assert obs.util is not None  # _held checked it
    return _move(state, level + 1, now,
                 f"{obs.util:.0f}% utilization < {policy.target_util:g}% at {level} per GPU "
                 f"({_measured(state, level)})")


def _measured(state: GpuLevel, level: int) -> str:
    rate = f"{state.rates[level]:.1f} trials/min" if level in state.rates else "rate unknown"
    gain = state.gains.get(level)
    return rate if gain is None else f"{rate}, {gain:.2f}x the level below"


def _move(state: GpuLevel, new: int, now: float, reason: str) -> tuple[GpuLevel, Change]:
    change = Change(state.gpu, state.limit, new, reason)
    return replace(state, limit=new, since=now, held=None), change


def _held(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
          host: HostObservation, gain: _Gain | None, below: int | None) -> str | None:
    """Why the GPU does not get one more trial now; None when it may."""
    level = state.limit
    if level >= min(state.ceiling, policy.max_per_gpu):
        return (f"at scheduler.max_trials_per_gpu={policy.max_per_gpu}"
                if level >= policy.max_per_gpu else f"{state.ceiling} per GPU was the best level")
    if host.concurrency >= host.cap:
        return f"at scheduler.parallel={host.cap} trials on this host"
    if host.concurrency + 1 > host.cores:
        return f"no CPU core for one more trial ({host.cores} cores, {host.concurrency} trials)"
    if obs.cpu_cores is not None and obs.cpu_cores >= policy.cpu_full * host.cores:
        return (f"host CPU: the running trials use {obs.cpu_cores:.1f} of {host.cores} cores "
                f"(one more would only share them)")
    if obs.running < level:  # another place would idle too; the last real reason still holds
        return state.held or f"{obs.running} of its {level} places busy"
    if obs.util is None or obs.readings < policy.min_readings:
        return "measuring utilization"
    if obs.util >= policy.target_util:
        return f"{obs.util:.0f}% utilization >= scheduler.target_gpu_util={policy.target_util:g}"
    if host.mem_peak_mib is None or obs.free_mib is None:
        return "GPU memory unknown"
    # Running trials may still grow to the expected peak: their growth is set aside too.
    growth = sum(max(0.0, host.mem_peak_mib - used) for used in obs.running_mem_mib)
    need = host.mem_peak_mib * policy.mem_margin + policy.mem_reserve_mib
    free = obs.free_mib - growth
    if free < need:
        return (f"GPU memory: {free:.0f} MiB free, a trial needs {need:.0f} MiB (peak "
                f"{host.mem_peak_mib:.0f} MiB x {policy.mem_margin:g} + {policy.mem_reserve_mib:g})")
    # Above level 1, only trials compared with the level below count: a level not yet judged
    # against it is no base to judge the next one.
    measured = sum(len(s) for s in state.times.get(level, {}).values()) if level == 1 \
        else (gain.trials if gain is not None else 0)
    # One trial will do where the GPU is nearly idle: at level 1 (nothing to compare with yet),
    # or where it shows a clear gain over the level below.
    fast = (obs.util < policy.target_util * policy.fast_util and free >= 2 * need
            and (level == 1 or (gain is not None and gain.ratio >= CLEAR)))
    if measured < TRIALS_PER_LEVEL and not (fast and measured >= 1):
        return f"measuring trial durations at {level} per GPU ({measured} of {TRIALS_PER_LEVEL})"
    if gain is not None and gain.ratio < policy.climb_gain:
        return (f"{level} per GPU finished {gain.ratio:.2f}x the trials/min of {below} per GPU, "
                f"under the {policy.climb_gain:g}x that pays for one more")
    return None
