"""``scheduler.trials_per_gpu=auto``: how many trials each GPU runs at once (pure rules).

Some studies gain from sharing a GPU and some lose, while leaving it equally idle, so
utilization alone cannot decide: each GPU gets a *level* (trials at once) that this module moves
one step at a time, from what was measured:

- up, while the GPU's utilization at the current level stays under ``target_util``, the next
  trial's expected peak memory (with margin) fits in the GPU's free memory, the running
  trials leave the host's cores room (``cpu_full``), and the current level's trial durations
  are known (so the next level can be judged against them);
- down when a level did not raise the trials finished per minute by ``min_gain`` over the
  level below (``ceiling``), or when a trial ran out of memory (for good).

A level is judged by *trial durations per kind*: each trial that ran wholly at level k is
compared with the mean duration of trials of its kind (its categorical parameters: a
LightGBM trial with a LightGBM one) at the level below j, and the level's gain is
``k / j`` over the geometric mean of those slowdowns. Trials that report steps are judged by
seconds per step, so that a pruned trial is not read as a fast one (placement/_trial_times.py);
a noisy trials/min of a few finishes, or a different mix of kinds, would misjudge a level. A
worker's first trial (process start, imports, OpenCL kernel build) is left out by the caller; a
running trial already slower than break-even counts: a loss shows before the trial ends.

How many trials a verdict needs: one trial's duration varies with what runs beside it, so

- "no gain" is a gain under ``1 + min_gain`` by more than its standard error (``Z``): the
  spread of the trials' log durations around their kind's mean, pooled over both levels,
  over the square root of how many trials there are (``_Gain.error``); a level is left on
  one trial only for a ``FAR_LOSS`` (or an OOM).
- The durations of every visit to a level are kept (``past``), so a level visited again is
  judged on all of its trials, not on its last two.
- A "no gain" against a base of under ``TRIALS_PER_LEVEL`` trials (the level below was left
  on one clear trial) is not counted: the level is tried again after ``REPROBE_TRIALS``
  trials below, against a base that was measured meanwhile. A counted loss
  (``FINAL_LOSSES``) or an OOM shuts the level for the run (re-probing every lost level
  did not pay).
- A level is climbed past only when it gained ``climb_gain`` over the level below (each
  climb costs a new worker's warm-up), and not when its gain shrank from the level below's
  by so much that the next level's, shrinking alike, would be under ``1 + min_gain``.
- Level 1 is left after ``TRIALS_PER_LEVEL`` trials, the base every later level is judged
  on; above it, one trial is enough to climb on where the GPU is nearly idle with memory for
  two more (``fast_util``) and the trial shows a ``CLEAR`` gain.

Start-up overlap (``scheduler.startup_overlap``, off until paired GPU runs choose it:
docs/QUALITY.md, "Defaults"): a GPU's first trial spends its
first seconds importing, loading data and creating its CUDA context while the GPU idles (0 %
for 12-13 s of each cold trial of workload c's CNN on an H200, whose ten epochs then took
2.3 s: its first steps, and the first level with them, came as it ended; issue 51). So while
no trial on a GPU at level 1 (never left) has reported a step or ended, and its latest
``min_readings`` readings were each under ``startup_idle_util``, the GPU takes one more trial
(``STARTUP_LEVEL``), as far as the ceiling, ``scheduler.parallel``, the host's cores
(``cpu_room``) and GPU memory (where a trial's peak is already known) allow; the first trial
was given the threads of that place's share only (placement/_packer.py: what its imports use
says nothing of its training, and LightGBM keeps every thread busy). One more, not
the first level's guess: nothing is known of the trials' GPU use before their first steps,
four heavy trials started at once would share the GPU's time and memory, and one more is a
level their first steps can confirm or undo. Once every trial that ran during the start-up
reported a step (or ended) and the GPU was read ``min_readings`` times since (``startup``
until then, held as "measuring"):

- where the host's cores carry them the level is kept, and it is the base later levels are
  judged on; no trial ran alone after its start-up, so it is not itself judged against one;
- two trials that left the GPU under ``target_util`` hardly waited on each other: the first
  level is taken from there (``target_util`` over each trial's share of the utilization)
  and judged against it by throughput;
- at ``target_util`` or more they may be sharing the GPU's time, which loses no throughput
  against one trial alone (the GPU's time is split, not wasted) and keeps the GPU busy: the
  level holds there. Going back to one cost workload (c) half its trials on an H200: one
  trial alone read 20-40 % busy, and the climb from it waited for trials timed at one
  (docs/quality/runs.md, "... the start-up overlap as first written");
- cores that do not carry them are a loss: back to one, climbed from there as usual;
- an OOM backs off, as at any level.

Only kinds measured at both levels are compared (placement/_trial_times.py folds a study of
many kinds into one). The H100 runs behind each of these rules: docs/DESIGN.md §3.7; the
figures: docs/BENCHMARKS.md "Trials per GPU".

Everything here is a function of its inputs (no clock, no I/O), so the tests drive it with
scripted numbers; placement/_packer.py gathers the inputs and applies the outputs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

__all__ = ["HOLD_CAUSES", "Change", "CoreRoom", "GpuLevel", "GpuObservation", "Hold", "HostObservation",
           "PackingPolicy", "Step", "Times", "TrialTime", "cpu_room", "decide", "expected_peak_mib",
           "may_overlap", "may_rise", "memory_room", "settled_level", "start_from", "step"]

TRIALS_PER_LEVEL = 2  # measured trials at a level (of one kind, for "no gain") before they count
CLEAR = 1.25  # a gain of this factor is clear from one trial on a nearly idle GPU
# A loss to this is clear from one trial: twice the 1.5x that one trial of a kind varied by
# its neighbours in run F, where one trial at 0.74x ended a level that gained 1.45x elsewhere.
FAR_LOSS = 0.5
POOLED = "*"  # kind of every trial, where no kind ran at both levels
PER_STEP = "/step"  # ends the kind of a trial judged by seconds per step (placement/_trial_times.py)
REPROBE_TRIALS = 8  # measured trials at the level below before an uncounted loss is tried again
FINAL_LOSSES = 1  # counted "no gain" verdicts that shut a level for the run
Z = 1.0  # standard errors by which a "no gain" must be under 1 + min_gain
# One trial's log duration around its kind's mean at a steady level: run D's fixed runs spread
# about 0.1 (LightGBM 5.2-6.8 s, torch 7.8-8.8 s at three per GPU); trials near a level change
# spread more (1.5x by their neighbours in run F). Until SPREAD_MIN_FREEDOM degrees of
# freedom measure it, SPREAD_PRIOR is assumed; never less than SPREAD_FLOOR.
SPREAD_PRIOR = 0.2
SPREAD_FLOOR = 0.08
SPREAD_MIN_FREEDOM = 3
KEPT_PER_KIND = 12  # durations kept per level and kind: the latest (the sampler's trials drift)
STARTUP_LEVEL = 2  # the most trials a GPU takes during its first trial's start-up (module doc)


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
    # scheduler.startup_overlap: one more trial during the first trial's start-up (module doc)
    startup_overlap: bool = False
    # scheduler.first_level: "under" or "fill" (_level_for)
    first_level: str = "under"
    # A GPU under this SM % in each of its latest min_readings readings is idle: a trial that
    # still imports or loads its data reads 0 % (workload c's CNN, 12-13 s on an H200); its
    # CUDA context and first kernels read above.
    startup_idle_util: float = 5.0


# What holds a GPU at its level (GpuLevel.held_by, hpo.packing.<host>'s levels' "held_by"):
# the low_gpu_util finding names it rather than blaming the trials' feeding for all of them.
HOLD_CAUSES = ("max_trials_per_gpu", "parallel", "cpu", "idle", "measuring", "busy", "memory",
               "no_gain")
Hold = tuple[str, str]  # (cause, why in words)


@dataclass(frozen=True)
class TrialTime:
    """One trial that ran at the GPU's current level (not its worker's first)."""

    kind: str
    seconds: float  # what is compared between levels: the duration, or seconds per step
    running: bool = False  # still running: its duration so far (a lower bound), or per step so far
    duration: float | None = None  # the whole trial's seconds where ``seconds`` is per step

    @property
    def whole_s(self) -> float:
        return self.seconds if self.duration is None else self.duration


@dataclass(frozen=True)
class GpuLevel:
    """One GPU's state between decisions."""

    gpu: int
    limit: int = 1  # trials at once now
    since: float = 0.0  # when ``limit`` was set (the caller's clock)
    ceiling: int = 1  # highest level allowed from now on
    times: dict[int, dict[str, tuple[float, ...]]] = field(default_factory=dict)  # level -> kind -> s
    past: dict[int, dict[str, tuple[float, ...]]] = field(default_factory=dict)  # earlier visits'
    losses: dict[int, int] = field(default_factory=dict)  # level -> "no gain" verdicts (OOM: final)
    rates: dict[int, float] = field(default_factory=dict)  # level -> trials per minute (shown)
    gains: dict[int, float] = field(default_factory=dict)  # level -> throughput / level below's
    held: str | None = None  # why it does not go up now (None: nothing holds it)
    # what holds it, in a word (HOLD_CAUSES): the findings' advice depends on it
    held_by: str | None = None
    # the level was taken during the first trial's start-up: confirmed or undone once the
    # trials that ran then are past theirs (module doc)
    startup: bool = False


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
    # mean SM % since every trial running on the GPU had reported its first step (their
    # set-up behind them), and how many readings that is; None before, or without reports
    steady_util: float | None = None
    steady_readings: int = 0
    # SM % of its latest readings since the level was set (at most min_readings, oldest first)
    latest_util: tuple[float, ...] = ()
    # no trial on it reported a step or ended yet: its first trials are still starting
    # (imports, data, CUDA context)
    starting: bool = False
    # mean SM % since every trial that ran during that start-up reported a step or ended,
    # and how many readings that is; None before
    after_startup_util: float | None = None
    after_startup_readings: int = 0


@dataclass(frozen=True)
class HostObservation:
    cores: int  # CPU cores this orchestrator may use
    concurrency: int  # trials at once now, over every GPU (the sum of the levels, capped)
    cap: int  # scheduler.parallel: the most trials at once
    mem_peak_mib: float | None  # expected peak GPU memory of the next trial (expected_peak_mib)
    adds: int = 1  # trials one level up adds: one per GPU judged together (placement/_packer.py)
    running: int | None = None  # trials running on the host now (None: take ``concurrency``)


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


@dataclass(frozen=True)
class _Gain:
    ratio: float  # throughput at the level / throughput at the level below
    trials: int  # trials it rests on (this visit's and earlier visits')
    of_one_kind: int  # the most of this visit's trials of one kind
    fresh: int  # this visit's trials among them
    thin_base: bool  # the compared kinds have under TRIALS_PER_LEVEL trials at the level below
    error: float  # standard error of log(ratio): the trials' spread over how many there are

    def surely_under(self, bound: float, z: float) -> bool:
        """Is the gain under ``bound`` even ``z`` standard errors up?"""
        return math.log(self.ratio) + z * self.error < math.log(bound)


def _log_means(durations: dict[str, tuple[float, ...]]) -> dict[str, float]:
    logs = {kind: [math.log(x) for x in s if x > 0] for kind, s in durations.items()}
    return {kind: statistics.fmean(xs) for kind, xs in logs.items() if xs}


def _gain(level: int, trials: tuple[TrialTime, ...], below: int,
          base: dict[str, tuple[float, ...]],
          earlier: dict[str, tuple[float, ...]] | None = None) -> _Gain | None:
    """The level's gain over ``below`` from its trials (this visit's, then ``earlier`` visits'
    finished ones) compared with their kind there, or None."""
    # Only kinds measured at both levels: a LightGBM trial of 4 s against torch trials of 8 s
    # would read as a gain, the other way round as a loss.
    means = _log_means(base)
    break_even = level / below
    logs: dict[str, list[float]] = {}  # kind -> log durations at the level
    for t in trials:
        # A running trial proves a loss only once it is past break-even; before, it proves nothing.
        if t.kind in means and t.seconds > 0 and (
                not t.running or t.seconds > break_even * math.exp(means[t.kind])):
            logs.setdefault(t.kind, []).append(math.log(t.seconds))
    fresh = sum(map(len, logs.values()))
    of_one_kind = max(map(len, logs.values()), default=0)
    for kind, durations in (earlier or {}).items():
        if kind in means:
            logs.setdefault(kind, []).extend(math.log(s) for s in durations if s > 0)
    slowdowns = [x - means[kind] for kind, xs in logs.items() for x in xs]
    if not slowdowns:
        return None
    based_on = sum(sum(s > 0 for s in base[kind]) for kind in logs)  # trials below compared
    error = _spread(logs, base) * math.sqrt(1 / len(slowdowns) + 1 / based_on)
    return _Gain(break_even / math.exp(statistics.fmean(slowdowns)), len(slowdowns), of_one_kind,
                 fresh, based_on < TRIALS_PER_LEVEL, error)


def _spread(level: dict[str, list[float]], base: dict[str, tuple[float, ...]]) -> float:
    """Standard deviation of a trial's log duration around its kind's mean (at its level),
    pooled over both levels; SPREAD_PRIOR until there are enough trials to say."""
    groups = [xs for xs in level.values()] + [[math.log(s) for s in base[k] if s > 0] for k in level]
    squares = sum(sum((x - mean) ** 2 for x in xs)
                  for xs, mean in ((xs, statistics.fmean(xs)) for xs in groups if xs))
    freedom = sum(len(xs) - 1 for xs in groups)
    if freedom < SPREAD_MIN_FREEDOM:
        return SPREAD_PRIOR
    return max(math.sqrt(squares / freedom), SPREAD_FLOOR)


def decide(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
           host: HostObservation, now: float) -> tuple[GpuLevel, Change | None]:
    """The GPU's next state, and the change of its level if there is one (with its reason).

    In order: an OOM backs off at once; the trials that ended at this level join its
    durations; a level that surely gained nothing over the one below backs off; a level
    above that lost once is opened again after REPROBE_TRIALS trials here; a level taken
    during the first trial's start-up waits for its trials' first steps, then is confirmed or
    undone (_startup_verdict); level 1 takes one more trial during that start-up
    (_startup_raise), or jumps straight to its first level; else one more trial, unless
    something holds it (_held)."""
    if obs.ooms:
        return _after_oom(state, now)
    state, finished = _fold_finished(state, obs)
    below = max((k for k in state.times if k < state.limit), default=None)
    gain = None if below is None else _gain(state.limit, obs.trials, below, state.times[below],
                                            state.past.get(state.limit, {}))
    if gain is not None:
        assert below is not None
        state = replace(state, gains={**state.gains, state.limit: round(gain.ratio, 2)})
        if _no_gain(policy, gain):
            return _back_off(state, below, gain, now)
    state = _reopen_above(policy, state, finished)
    if state.startup:
        return _startup_verdict(policy, state, obs, host, now)
    raised = _startup_raise(policy, state, obs, host, now)
    if raised is not None:
        return raised
    first = _first_jump(policy, state, obs, host, now)
    if first is not None:
        return first
    held = _held(policy, state, obs, host, gain, below)
    if held is not None:
        return replace(state, held_by=held[0], held=held[1]), None
    assert obs.util is not None  # _held checked it
    return _move(state, state.limit + 1, now,
                 f"{obs.util:.0f}% utilization < {policy.target_util:g}% at {state.limit} per GPU "
                 f"({_measured(state, state.limit)})")


def _after_oom(state: GpuLevel, now: float) -> tuple[GpuLevel, Change | None]:
    """A trial ran out of memory: this level is shut for the run (at level 1, the next: one
    trial alone did not fit), and the GPU goes one level down."""
    level = state.limit
    state = replace(state, ceiling=max(1, level - 1),
                    losses={**state.losses, max(level, 2): FINAL_LOSSES})
    if level > 1:
        return _move(state, level - 1, now, f"a trial ran out of GPU memory at {level} per GPU")
    return replace(state, held_by="memory", held="a trial ran out of GPU memory at 1 per GPU"), None


def _fold_finished(state: GpuLevel,
                   obs: GpuObservation) -> tuple[GpuLevel, dict[str, tuple[float, ...]]]:
    """The level's durations refined with every trial that ended at it, and its trials/min
    (shown): from whole durations, every visit's where ``times`` holds them, this visit's
    where trials were judged per step. Also the finished trials' durations by kind."""
    finished: dict[str, tuple[float, ...]] = {}
    for t in obs.trials:
        if not t.running:
            finished[t.kind] = (*finished.get(t.kind, ()), t.seconds)
    if not finished:
        return state, finished
    level = state.limit
    merged = _merge(state.past.get(level, {}), finished)
    wholes = ([t.whole_s for t in obs.trials if not t.running] if _per_step(merged)
              else [s for durations in merged.values() for s in durations])
    return replace(state, times={**state.times, level: merged},
                   rates={**state.rates, level: round(level * 60.0 / statistics.fmean(wholes), 2)}
                   ), finished


def _no_gain(policy: PackingPolicy, gain: _Gain) -> bool:
    """Did the level surely gain nothing? A verdict needs this visit's trials (earlier
    visits' alone already had their say): a far loss on one trial, or a gain under
    min_gain by more than its standard error on TRIALS_PER_LEVEL trials of one kind."""
    return bool(gain.fresh) and (gain.ratio < FAR_LOSS or (gain.of_one_kind >= TRIALS_PER_LEVEL
                                                          and gain.surely_under(1 + policy.min_gain, Z)))


def _back_off(state: GpuLevel, below: int, gain: _Gain, now: float) -> tuple[GpuLevel, Change]:
    """One level down after no gain. Against a base of one trial (a level left on one clear
    trial) a loss may be the base's noise: back down to measure the base, without counting a
    loss."""
    level = state.limit
    losses = state.losses.get(level, 0) + (0 if gain.thin_base else 1)
    state = replace(state, ceiling=level - 1, losses={**state.losses, level: losses})
    again = ("for good" if losses >= FINAL_LOSSES
             else f"tried again after {REPROBE_TRIALS} trials at {level - 1}")
    return _move(state, level - 1, now,
                 f"{level} per GPU {_pace(state, below, gain.ratio)} of {below} per GPU "
                 f"({gain.trials} trials compared with their kind): no gain, {again}")


def _reopen_above(policy: PackingPolicy, state: GpuLevel,
                  finished: dict[str, tuple[float, ...]]) -> GpuLevel:
    """The level above lost once, uncounted: tried again after REPROBE_TRIALS trials here."""
    level = state.limit
    if (level == state.ceiling < policy.max_per_gpu
            and state.losses.get(level + 1, 0) < FINAL_LOSSES
            and sum(map(len, finished.values())) >= REPROBE_TRIALS):
        return replace(state, ceiling=level + 1)
    return state


def _first_jump(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
                host: HostObservation, now: float) -> tuple[GpuLevel, Change] | None:
    """Level 1, never left yet: straight to its first level (_first_level), with the base it
    is judged on: level 1's trials, running ones per step."""
    if state.limit != 1 or state.past or state.losses:
        return None
    base = _merge(state.times.get(1, {}), _running_per_step(obs.trials))
    first = _first_level(policy, state, obs, host) if base else None
    if first is None:
        return None
    target, why = first
    return _move(replace(state, times={**state.times, 1: base}), target, now, why)


def memory_room(policy: PackingPolicy, obs: GpuObservation,
                host: HostObservation) -> tuple[float, float] | None:
    """(MiB free once the running trials reach the expected peak, MiB one more trial needs),
    or None while either is unknown. Running trials may still grow to the expected peak:
    their growth is set aside."""
    if host.mem_peak_mib is None or obs.free_mib is None:
        return None
    growth = sum(max(0.0, host.mem_peak_mib - used) for used in obs.running_mem_mib)
    return obs.free_mib - growth, host.mem_peak_mib * policy.mem_margin + policy.mem_reserve_mib


def cpu_room(policy: PackingPolicy, host: HostObservation,
             used: float | None) -> tuple[int | None, str]:
    """The most trials at once the host's cores carry, and what that rests on.

    From what the running trials were measured to use (``used``: host cores, the telemetry
    sampler's psutil readings, placement/_packer.py): as many trials as fit in ``cpu_full``
    of the cores at their mean use each; None (no bound) when they use none. The threads
    given to a trial are no measure of its use: a GPU trial given 16 threads used a few,
    and counted by its threads the CNN of workload (c) on an H200 waited for its first
    trial's end before a second one started (issue 51). Without readings yet, the safe rule:
    one trial per core (LightGBM's OpenMP threads spin: 16 + 8 threads on 16 cores made its
    trials 30x slower, docs/BENCHMARKS.md "Costs the code cites")."""
    if used is None:
        return host.cores, "CPU cores"
    running = host.running if host.running else host.concurrency
    per_trial = used / max(running, 1)
    if per_trial <= 0:
        return None, "host CPU"
    return int(policy.cpu_full * host.cores / per_trial), "host CPU"


def _first_level(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
                 host: HostObservation) -> tuple[int, str] | None:
    """The level a GPU goes to from its first trial alone, and why; None to climb as usual.

    A trial's steady utilization says how many like it the GPU has time for: at 23 % (the CNN
    of workload c on an H200), three trials ran 2.4x the trials per minute of one, where the
    climb of one level at a time, each judged on two trials, was still at two per GPU after
    60 s (docs/QUALITY.md). So once the first trial is past its set-up (it reported a step,
    and the GPU was read ``min_readings`` times since), the GPU goes straight to
    ``target_util / utilization`` trials, as far as memory, the host's cores and
    ``scheduler.parallel`` allow; the trials at that level then confirm it against this one
    by throughput, as any level is judged, and a loss takes it back down."""
    if (obs.running < 1 or obs.steady_util is None or obs.steady_readings < policy.min_readings
            or obs.steady_util >= policy.target_util):
        return None
    return _level_for(policy, state, obs, host, obs.steady_util, 1)


def _level_for(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
               host: HostObservation, util: float, at: int) -> tuple[int, str] | None:
    """The level ``at`` trials that keep the GPU ``util`` % busy point to: ``target_util``
    over each trial's share, as far as memory, the host's cores and ``scheduler.parallel``
    allow, and why; None when that is no higher than ``at``.

    Rounded down (``first_level=under``), the level stays under ``target_util`` and the climb
    adds one more once a trial timed it: on workload (c)'s CNN on an H200 one trial read
    27-40 % busy, went to 2, and reached 3 another 18-46 s later, or never in its 70 s
    (docs/quality/runs.md, ``gpu-o61``). Rounded up (``fill``), it goes where that climb would
    end, and the throughput verdict there undoes an overshoot as it undoes any level that
    does not gain."""
    room = memory_room(policy, obs, host)
    if room is None:
        return None
    free, need = room
    share = max(util / at, 1.0)
    carried, by = cpu_room(policy, host, obs.cpu_cores)
    # true division: floats' floor division reads 80 / 1.6 % (1.6 a hair over in binary) as 49
    trials, fill = policy.target_util / share, policy.first_level == "fill"
    limits = {"utilization": math.ceil(trials) if fill else int(trials),
              "scheduler.max_trials_per_gpu": min(policy.max_per_gpu, state.ceiling),
              "GPU memory": at + int(max(free, 0.0) // need),
              "scheduler.parallel": at + (host.cap - host.concurrency) // host.adds}
    if carried is not None:
        limits[by] = at + max(carried - host.concurrency, -at) // host.adds
    target = min(limits.values())
    if target <= at:
        return None
    bound = min(limits, key=lambda name: (limits[name], name != "utilization"))
    each = "" if at == 1 else " a trial"
    return target, (f"{util:.0f}% utilization at {at} per GPU: {target} per GPU "
                    f"(bound by {bound}; {policy.target_util:g}% / {share:.0f}%{each} "
                    f"would be {limits['utilization']}"
                    f"{', rounded up' if fill else ''}), "
                    "confirmed by throughput next")


def _startup_raise(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
                   host: HostObservation, now: float) -> tuple[GpuLevel, Change] | None:
    """Level 1, never left, while its first trials are starting (no step, no end) and the GPU
    read idle: STARTUP_LEVEL, where the ceiling, scheduler.parallel, the host's cores and GPU
    memory (where known) allow; None otherwise, and the usual rules say what holds it."""
    latest = obs.latest_util
    if (not may_overlap(policy, state) or not obs.starting or obs.running < state.limit
            or len(latest) < policy.min_readings or max(latest) >= policy.startup_idle_util):
        return None
    carried, _ = cpu_room(policy, host, obs.cpu_cores)
    room = memory_room(policy, obs, host)
    if (host.concurrency >= host.cap
            or (carried is not None and host.concurrency + host.adds > carried)
            or (room is not None and room[0] < room[1])):
        return None
    raised, change = _move(state, STARTUP_LEVEL, now, (
        f"started during the first trial's start-up (GPU idle: under "
        f"{policy.startup_idle_util:g}% in its last {len(latest)} readings, no step reported "
        "yet); its first steps confirm or undo it"))
    return replace(raised, startup=True), change


def may_overlap(policy: PackingPolicy, state: GpuLevel) -> bool:
    """May the GPU still take a trial during its first trial's start-up (_startup_raise), its
    readings and the host allowing? Level 1, never left, under a ceiling above it, with
    ``scheduler.startup_overlap`` on."""
    return (policy.startup_overlap and state.limit == 1 and not state.past and not state.losses
            and min(policy.max_per_gpu, state.ceiling) >= STARTUP_LEVEL)


def _startup_verdict(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
                     host: HostObservation, now: float) -> tuple[GpuLevel, Change | None]:
    """A level taken during the first trial's start-up, once the trials that ran then are past
    theirs: kept where the host's cores carry them, and the first level taken from there
    once a trial timed this one (its base) where they left the GPU under ``target_util``;
    else back to one (module doc)."""
    level = state.limit
    util = obs.after_startup_util
    if util is None or obs.after_startup_readings < policy.min_readings:
        return replace(state, held_by="measuring", held=(
            f"{level} per GPU since the first trial's start-up (GPU idle): waiting for its "
            "trials' first steps to confirm or undo it")), None
    carried, _ = cpu_room(policy, host, obs.cpu_cores)
    if carried is not None and host.concurrency > carried:
        used = "use not measured" if obs.cpu_cores is None else f"{obs.cpu_cores:.1f} used"
        undone = (f"host CPU: {host.cores} cores ({used}) carry {carried} such trials, not "
                  f"{host.concurrency}")
    else:
        side = "under" if util < policy.target_util else "at or over"
        kept = (f"{level} per GPU, started during the first trial's start-up, kept: {util:.0f}% "
                f"utilization after it, {side} {policy.target_util:g}%")
        confirmed = replace(state, startup=False)
        first = _level_for(policy, confirmed, obs, host, util, level)
        if first is None:
            return replace(confirmed, held_by="measuring", held=kept), None
        base = _merge(state.times.get(level, {}), _running_per_step(obs.trials))
        target, why = first
        if not base:  # the first level is judged against this one: a trial must time it
            return replace(state, held_by="measuring", held=(
                f"{kept}; {target} per GPU once a trial timed {level} per GPU")), None
        return _move(replace(confirmed, times={**confirmed.times, level: base}), target, now, why)
    return _move(state, 1, now, f"{undone}; back to 1 per GPU, climbed from there as usual")


def _running_per_step(trials: tuple[TrialTime, ...]) -> dict[str, tuple[float, ...]]:
    """The running trials' seconds per step so far, by kind: the base a first level is
    judged on when no trial at level 1 has ended yet."""
    base: dict[str, tuple[float, ...]] = {}
    for t in trials:
        if t.running and t.kind.endswith(PER_STEP):
            base[t.kind] = (*base.get(t.kind, ()), t.seconds)
    return base


Times = dict[int, dict[str, tuple[float, ...]]]  # level -> kind -> durations (GpuLevel.times)


def settled_level(state: GpuLevel) -> tuple[int, Times] | None:
    """The level a GPU settled at in this run, with the durations of the levels below it
    (the base its next run's trials are judged on); None while nothing is settled.

    A level above one is settled once its trials were judged against the level below (its
    gain is known: kept, not backed off); level one is, once a loss or an OOM shut the level
    above. A run that ends mid-climb settles nothing, and the study keeps an earlier run's
    level."""
    if state.limit == 1:
        return (1, {}) if state.losses.get(2, 0) >= FINAL_LOSSES else None
    if state.limit not in state.gains:
        return None
    below = {k: kinds for k, kinds in state.times.items() if k < state.limit and kinds}
    return (state.limit, below) if below else None


def start_from(policy: PackingPolicy, gpu: int, level: int, times: Times,
               now: float) -> GpuLevel | None:
    """A GPU's state at the start of a run of a study that settled at ``level`` before (same
    objective, same GPU model: placement/_packer.py): at that level from its first trial, with
    the earlier run's durations of the levels below as the base its trials are judged on, so
    that a slowdown still backs off (and an OOM, as ever). The climb of issue 51's CNN took
    40 s of a 70 s run before it reached three per GPU. None where there is nothing to start
    from: level one, or no base below."""
    level = min(level, policy.max_per_gpu)
    base = {k: kinds for k, kinds in times.items() if k < level and kinds}
    if level < 2 or not base:
        return None
    return GpuLevel(gpu=gpu, limit=level, since=now, ceiling=policy.max_per_gpu, times=base,
                    past={k: kinds for k, kinds in base.items()})


def may_rise(policy: PackingPolicy, state: GpuLevel) -> bool:
    """Can the level still go up in this run, now or at a re-probe? Not at the cap, nor once
    an OOM or a final loss shut the level above."""
    return state.limit < policy.max_per_gpu and state.losses.get(state.limit + 1, 0) < FINAL_LOSSES


def _measured(state: GpuLevel, level: int) -> str:
    rate = f"{state.rates[level]:.1f} trials/min" if level in state.rates else "rate unknown"
    if (gain := state.gains.get(level)) is None:
        return rate
    per_step = " per step" if _per_step(state.times.get(level, {})) else ""
    return f"{rate}, {gain:.2f}x the level below{per_step}"


def _pace(state: GpuLevel, below: int | None, ratio: float) -> str:
    """'ran 0.84x the steps/min' where the trials were compared per step (their trials/min
    also count the pruner's early stops), else 'finished 0.84x the trials/min'."""
    per_step = below is not None and _per_step(state.times.get(below, {}))
    return f"ran {ratio:.2f}x the steps/min" if per_step else f"finished {ratio:.2f}x the trials/min"


def _per_step(durations: dict[str, tuple[float, ...]]) -> bool:
    """Were some of these trials judged by seconds per step (placement/_trial_times.py)?"""
    return any(kind.endswith(PER_STEP) for kind in durations)


def _merge(earlier: dict[str, tuple[float, ...]],
           now: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """Durations per kind of earlier visits and this one, the latest KEPT_PER_KIND of each."""
    kinds = {*earlier, *now}
    return {k: (*earlier.get(k, ()), *now.get(k, ()))[-KEPT_PER_KIND:] for k in sorted(kinds)}


def _move(state: GpuLevel, new: int, now: float, reason: str) -> tuple[GpuLevel, Change]:
    """Leave the level: its durations so far are its ``past`` for the next visit."""
    change = Change(state.gpu, state.limit, new, reason)
    past = {**state.past, state.limit: state.times.get(state.limit, {})}
    return replace(state, limit=new, since=now, held=None, held_by=None, past=past,
                   startup=False), change


def _held(policy: PackingPolicy, state: GpuLevel, obs: GpuObservation,
          host: HostObservation, gain: _Gain | None, below: int | None) -> Hold | None:
    """What holds the GPU from one more trial now, and why; None when nothing does: the
    first row of ``_HOLDS`` that holds it, in order."""
    ask = _Ask(policy, state, obs, host, gain, below)
    return next((hold for row in _HOLDS if (hold := row(ask)) is not None), None)


@dataclass(frozen=True)
class _Ask:
    """What one more trial on a GPU is judged on (the rows of ``_HOLDS``)."""

    policy: PackingPolicy
    state: GpuLevel
    obs: GpuObservation
    host: HostObservation
    gain: _Gain | None  # the level's gain over the level below, where measured
    below: int | None  # the level below it was compared with

    @property
    def level(self) -> int:
        return self.state.limit


def _at_ceiling(a: _Ask) -> Hold | None:
    """At scheduler.max_trials_per_gpu, or at the best level measured."""
    if a.level < min(a.state.ceiling, a.policy.max_per_gpu):
        return None
    if a.level >= a.policy.max_per_gpu:
        return "max_trials_per_gpu", f"at scheduler.max_trials_per_gpu={a.policy.max_per_gpu}"
    if a.state.losses.get(a.level + 1, 0) >= FINAL_LOSSES:
        return "no_gain", f"{a.state.ceiling} per GPU was the best level"
    return "no_gain", (f"{a.state.ceiling} per GPU was the best level so far ({a.level + 1} is tried again "
            f"after {REPROBE_TRIALS} trials)")


def _at_parallel(a: _Ask) -> Hold | None:
    if a.host.concurrency >= a.host.cap:
        return "parallel", f"at scheduler.parallel={a.host.cap} trials on this host"
    return None


def _no_cpu_room(a: _Ask) -> Hold | None:
    """The host's cores carry the group's step up (one trial per GPU): ``cpu_room``."""
    carried, _ = cpu_room(a.policy, a.host, a.obs.cpu_cores)
    if carried is None or a.host.concurrency + a.host.adds <= carried:
        return None
    if a.obs.cpu_cores is None:
        return "cpu", (f"no CPU core for {a.host.adds} more trial(s) ({a.host.cores} cores, "
                f"{a.host.concurrency} trials; their CPU use not measured yet)")
    return "cpu", (f"host CPU: the running trials use {a.obs.cpu_cores:.1f} of {a.host.cores} cores "
            f"({a.host.adds} more would pass {a.policy.cpu_full:.0%} of them)")


def _places_idle(a: _Ask) -> Hold | None:
    """Another place would idle too; the last real reason still holds."""
    if a.obs.running < a.level:
        if a.state.held is not None:
            return a.state.held_by or "idle", a.state.held
        return "idle", f"{a.obs.running} of its {a.level} places busy"
    return None


def _busy_enough(a: _Ask) -> Hold | None:
    if a.obs.util is None or a.obs.readings < a.policy.min_readings:
        return "measuring", "measuring utilization"
    if a.obs.util >= a.policy.target_util:
        return "busy", f"{a.obs.util:.0f}% utilization >= scheduler.target_gpu_util={a.policy.target_util:g}"
    return None


def _no_memory(a: _Ask) -> Hold | None:
    room = memory_room(a.policy, a.obs, a.host)
    if room is None:
        return "measuring", "GPU memory unknown"
    free, need = room
    if free < need:
        return "memory", (f"GPU memory: {free:.0f} MiB free, a trial needs {need:.0f} MiB (peak "
                f"{a.host.mem_peak_mib:.0f} MiB x {a.policy.mem_margin:g} + "
                f"{a.policy.mem_reserve_mib:g})")
    return None


def _unmeasured(a: _Ask) -> Hold | None:
    """Too few trials measured at the level. Above a base level, only trials compared with
    the level below count: a level not yet judged against it is no base to judge the next one.
    One trial will do where the GPU is nearly idle, has memory for two more, and the trial
    shows a clear gain; a base level, of which nothing below was measured (level 1, or one
    kept from the first trial's start-up), is measured on TRIALS_PER_LEVEL of its own."""
    measured = sum(len(s) for s in a.state.times.get(a.level, {}).values()) if a.below is None \
        else (a.gain.trials if a.gain is not None else 0)
    room = memory_room(a.policy, a.obs, a.host)
    assert room is not None and a.obs.util is not None  # _no_memory and _busy_enough: known
    fast = (a.obs.util < a.policy.target_util * a.policy.fast_util and room[0] >= 2 * room[1]
            and a.gain is not None and a.gain.ratio >= CLEAR)
    if measured < TRIALS_PER_LEVEL and not (fast and measured >= 1):
        return "measuring", (f"measuring trial durations at {a.level} per GPU ({measured} of "
                             f"{TRIALS_PER_LEVEL})")
    return None


def _small_gain(a: _Ask) -> Hold | None:
    if a.gain is not None and a.gain.ratio < a.policy.climb_gain:
        return "no_gain", (f"{a.level} per GPU {_pace(a.state, a.below, a.gain.ratio)} of {a.below} per GPU, "
                f"under the {a.policy.climb_gain:g}x that pays for one more")
    return None


def _shrinking_gain(a: _Ask) -> Hold | None:
    """Gains shrink level by level (run A: 1.62x, 1.27x, then 0.89x): where the last two
    shrank by as much again, the next level is not worth its warm-up."""
    before = a.state.gains.get(a.below) if a.below is not None else None
    if a.gain is None or not before:
        return None
    next_gain = a.gain.ratio ** 2 / before
    if next_gain < 1 + a.policy.min_gain:
        return "no_gain", (f"{a.level} per GPU gained {a.gain.ratio:.2f}x after {before:.2f}x: at that rate "
                f"{a.level + 1} would gain {next_gain:.2f}x, under {1 + a.policy.min_gain:g}x")
    return None


# What holds a GPU at its level, in the order asked: the first that holds says why.
_HOLDS = (_at_ceiling, _at_parallel, _no_cpu_room, _places_idle, _busy_enough,
          _no_memory, _unmeasured, _small_gain, _shrinking_gain)


@dataclass(frozen=True)
class CoreRoom:
    """The host's cores as a raise sees them, where the packer sets each trial's threads."""

    cores: int  # CPU cores the run's trials share
    held: int  # threads the running trials were given
    at_once: int  # trials at once now: the levels over every GPU, capped
    cap: int  # scheduler.parallel: the most trials at once
    waiting: int  # raises that wait for cores, this one counted
    used: float | None = None  # host cores the running trials were measured to use (None: unknown)

    def share(self) -> int:
        """Each trial's cores once the waiting raises are in: a place refilled meanwhile
        already gets the smaller share, so the cores for the new place come free."""
        return max(1, self.cores // max(min(self.cap, self.at_once + self.waiting), 1))

    def free(self) -> float:
        """Cores the running trials leave: by their measured use where it is known and under
        the threads given (a GPU trial given 16 threads may use one; the readings may still
        count a trial that ended), else by the threads they were given."""
        return self.cores - (self.held if self.used is None else min(self.used, self.held))

    def enough(self) -> bool:
        """Do the running trials leave the new share free? (16 + 8 OpenMP threads on 16
        cores made LightGBM trials 30x slower: docs/BENCHMARKS.md "Costs the code cites";
        such trials are measured using their threads, so they still wait)"""
        return self.free() >= self.share()


@dataclass(frozen=True)
class Step:
    """What one GPU group's turn decided."""

    state: GpuLevel  # its state from now on
    change: Change | None = None  # its level changed now
    waiting: tuple[GpuLevel, Change] | None = None  # a raise decided, waiting for cores
    verdict: GpuLevel | None = None  # :func:`decide`'s state, where it ran


def step(policy: PackingPolicy, state: GpuLevel, waiting: tuple[GpuLevel, Change] | None,
         obs: GpuObservation, host: HostObservation, cores: CoreRoom | None,
         now: float) -> Step:
    """One GPU group's turn. ``waiting``: a raise decided earlier that waits for the running
    trials to leave its cores; ``cores``: the host's cores, None where
    ``scheduler.threads_per_trial`` fixes the threads (a raise never waits then).

    - a raise waiting, and a trial ran out of memory at the old level since: no raise after
      all, decided afresh;
    - a raise waiting, the cores still held: it waits on, nothing else changes;
    - a raise waiting, the cores free: it is made now;
    - otherwise :func:`decide`; a raise it makes while the cores are held waits for them
      (``held`` says so)."""
    if waiting is not None and not obs.ooms:
        if cores is not None and not cores.enough():
            return Step(state, waiting=waiting)
        raised, raise_ = waiting
        return Step(replace(raised, since=now), raise_)
    new, change = decide(policy, state, obs, host, now)
    if change is None or change.new <= change.old or cores is None or cores.enough():
        return Step(new, change, verdict=new)
    held = (f"going to {change.new} per GPU once the running trials leave {cores.share()} "
            "cores free")
    return Step(replace(state, held=held, held_by="cpu"), waiting=(new, change), verdict=new)
