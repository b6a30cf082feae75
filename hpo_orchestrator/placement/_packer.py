"""The packer: gathers what ``scheduler.trials_per_gpu=auto`` decides from, applies the decision.

Inputs: the GPUs' readings (the telemetry sampler keeps them), the trials that ended on each
GPU (the loop tells :meth:`Packer.trial_ended`), the slot pool's busy places and free memory,
and each GPU's start-up (:class:`StartUp`: until its first step or end, for the start-up
overlap).
Outputs: each GPU's level in the slot pool, the threads a new trial gets, and the study attr
``hpo.packing.<host>`` (every change with its time, GPU, old -> new and reason; status and
report show it). The rules themselves are pure: placement/_rules.py.

GPUs of one model and size are judged together (:func:`gpu_groups`): one study's trials on
identical GPUs have one best level, and judged apart two GPUs misread each other. In run K on
two H100s (docs/DESIGN.md §3.7) they share the host's cores, so one GPU's climb slowed the
other's trials, read there as a loss. Together, a level rests on the trials of every GPU
(twice the evidence in the same time on two GPUs: a shorter climb) and the GPUs move as one;
memory is checked on the GPU with the least free, an OOM on any of them counts.

Threads (auto): each trial gets the host's cores over the trials at once, but never more
than the running trials leave free, so the cores are never oversubscribed (LightGBM's OpenMP
threads spin: 16 + 8 threads on 16 cores made trials 30x slower, docs/BENCHMARKS.md "Costs the code cites"). A
level that goes up waits until the running trials leave the new share free: the trial that
runs at 16 threads ends first, then both start at 8. While a GPU's first trial starts up, the
place the start-up overlap may open counts as a place (``_startup_places``): that trial gets
8 of 16 cores, and the one the overlap starts the other 8, whatever either does once trained.

Single-threaded: only the orchestrator's loop calls it.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import psutil

from hpo_orchestrator import keys
from hpo_orchestrator.placement._rules import (
    KEPT_PER_KIND,
    Change,
    CoreRoom,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    Times,
    expected_peak_mib,
    may_overlap,
    may_rise,
    memory_room,
    settled_level,
    start_from,
    step,
)
from hpo_orchestrator.placement._settings import PlacementSettings, threads_per_trial
from hpo_orchestrator.placement._slots import SlotPool
from hpo_orchestrator.placement._trial_times import Span, TrialTimes, pooled_kind
from hpo_orchestrator.placement._view import Readings, RunningView, StudyAttrs
from hpo_orchestrator.telemetry import DeviceReading

__all__ = ["Packer", "detect_mps", "forget_packing", "gpu_groups", "packing_key"]

_DECIDE_EVERY_S = 1.0
# The trials' CPU use a new trial's threads are fitted to: the latest, as a trial's use
# changes from its set-up (imports: a core) to its training.
_CPU_WINDOW_S = 10.0
_HELD_WRITE_EVERY_S = 10.0  # a changed "held" reason alone is written at most this often
_MAX_CHANGES = 500  # changes kept in the attr (the latest)
_MPS_DAEMONS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def packing_key(host: str) -> str:
    return f"{keys.PACKING_PREFIX}{host}"


def forget_packing(study: StudyAttrs, host: str) -> None:
    """A run on ``host`` with no GPU slot packs nothing: an earlier run's hpo.packing.<host>
    becomes a fixed entry without levels, which status and report do not show (the attr
    cannot be deleted through Optuna)."""
    if packing_key(host) in study.user_attrs:
        settled = study.user_attrs[packing_key(host)].get("settled") or []
        study.set_user_attr(packing_key(host), {"mode": "fixed", "mps": {"active": False},
                                                "levels": [], "changes": [], "settled": settled})


def gpu_groups(pool: SlotPool) -> dict[int, tuple[int, ...]]:
    """The GPUs judged together, by their lowest index: those of one model and memory size."""
    gpus = {s.gpu.index: s.gpu for s in pool.slots if s.gpu is not None}  # a GPU has many slots
    kinds: dict[tuple[str, float | None], list[int]] = {}
    for index, gpu in sorted(gpus.items()):
        kinds.setdefault((gpu.name, gpu.memory_total_mib), []).append(index)
    return {min(members): tuple(sorted(members)) for members in kinds.values()}


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


class Packer:
    def __init__(self, settings: PlacementSettings, pool: SlotPool, readings: Readings | None,
                 study: StudyAttrs) -> None:
        self.pool = pool
        self.readings = readings
        self.study = study
        self.host = settings.host
        self.cores = settings.cores
        self._threads_configured = settings.threads
        self._times = TrialTimes(reuse=settings.reuse)  # which trials measure
        self.policy: PackingPolicy = settings.policy
        now = time.monotonic()
        self.levels = {index: GpuLevel(gpu=index, limit=limit, since=now,
                                       ceiling=self.policy.max_per_gpu)
                       for index, limit in pool.limits.items()}
        self._groups = gpu_groups(pool)  # judged together, by their lowest index
        self._pending: dict[int, tuple[GpuLevel, Change]] = {}  # group -> raised, waiting for cores
        self._total_mib = {s.gpu.index: s.gpu.memory_total_mib for s in pool.slots if s.gpu}
        self._ooms: dict[int, list[float]] = {index: [] for index in self.levels}  # when
        self._mem_peaks: list[float] = []
        self._changes: list[dict[str, Any]] = []
        self._decided_at = now
        self._written_at = -float("inf")
        self._pooled = False  # the trials' kinds were pooled (TrialTimes.pooled)
        self._seen: dict[int, GpuObservation] = {}  # each GPU's last observation, for the attr
        # group -> the level at which one more trial was last seen to fit in GPU memory: a
        # spare worker is kept for the place above only then (workers_wanted)
        self._fits_above: dict[int, int] = {}
        self._notes: list[str] = []  # level changes not yet said (take_notes)
        self._startups = {index: StartUp() for index in self.levels}  # start-up overlap's
        self.objective = settings.objective
        # (objective, GPU model, memory) -> the level a run of this study settled at there, with
        # the durations below it: every objective's and model's, kept on in the attr
        earlier = study.user_attrs.get(packing_key(self.host))
        self._settled = read_settled(earlier.get("settled") if isinstance(earlier, dict) else None)
        self._models = {leader: self._model(leader) for leader in self._groups}
        if pool.auto:
            self._start_settled(now)
        mps = detect_mps()
        self._record: dict[str, Any] = {
            "mode": "auto" if pool.auto else "fixed", "target_gpu_util": self.policy.target_util,
            "max_trials_per_gpu": self.policy.max_per_gpu, "cores": self.cores, "mps": mps}
        # Fixed levels are worth a write only with MPS, or over an earlier run's entry of
        # this host: status and report read the host's latest run there, and an auto run's
        # levels left in place would be shown as this run's packing.
        if pool.auto or mps["active"] or packing_key(self.host) in study.user_attrs:
            self._write()

    def _model(self, leader: int) -> tuple[str, float | None]:
        gpu = next(s.gpu for s in self.pool.slots if s.gpu is not None and s.gpu.index == leader)
        return gpu.name, gpu.memory_total_mib

    def _start_settled(self, now: float) -> None:
        """Each group of GPUs at the level an earlier run of this study settled at on their
        model, for the same objective (rules.start_from); the change is said and kept."""
        changes = []
        for leader, members in self._groups.items():
            entry = self._settled.get((self.objective, *self._models[leader]))
            if entry is None:
                continue
            level, times = entry
            state = start_from(self.policy, leader, level, times, now)
            if state is None:
                continue
            below = max(state.times)
            reason = (f"an earlier run of this study settled at {state.limit} per GPU on "
                      f"{self._models[leader][0]}: started there, judged against that run's "
                      f"{below} per GPU")
            self._set(members, state)
            for m in members:
                self.pool.set_limit(m, state.limit)
                changes.append(Change(m, 1, state.limit, reason))
        self._tell(changes)

    def threads_for_next(self, running: Iterable[RunningView]) -> int:
        """CPU threads for the next trial. Fixed levels: the cores over the trials at once.
        Auto: that share, within what the running trials leave free (module docstring); the
        place the start-up overlap may open on a GPU whose first trial starts counts as a
        place: its trial finds its share free whatever the first one does once trained
        (LightGBM keeps every thread it was given busy; 16 + 8 on 16 cores ran 30x slower)."""
        if self._threads_configured is not None or not self.pool.auto:
            return threads_per_trial(self._threads_configured, self.pool.concurrency, self.cores)
        room = self._core_room(running, waiting=len(self._pending) + self._startup_places(),
                               used=self._cpu_used())
        return max(1, min(room.share(), int(room.free())))

    def _startup_places(self) -> int:
        """Places the start-up overlap may still open: one per GPU whose first trials are
        starting and whose level may take one (rules.may_overlap)."""
        return sum(1 for index, state in self.levels.items()
                   if self._startups[index].starting and may_overlap(self.policy, state))

    def _core_room(self, running: Iterable[RunningView], waiting: int,
                   used: float | None) -> CoreRoom:
        return CoreRoom(cores=self.cores, held=sum(v.threads or 0 for v in running),
                        at_once=self.pool.concurrency, cap=self.pool.cap, waiting=waiting,
                        used=used)

    def _cpu_used(self, since: float | None = None) -> float | None:
        """Host cores the running trials used together, the mean of the sampler's rounds
        since ``since`` (default: the last _CPU_WINDOW_S); None under min_readings rounds."""
        if self.readings is None:
            return None
        start = time.monotonic() - _CPU_WINDOW_S if since is None else since
        cpu = self.readings.cpu_readings(start)
        return statistics.fmean(cpu) if len(cpu) >= self.policy.min_readings else None

    def trial_ended(self, trial: RunningView, fail_reason: str | None,
                    gpu_mem_peak_mib: float | None) -> None:
        """A trial left its slot (told before the slot takes its next trial: an OOM lowers
        its GPU's level at once)."""
        if trial.gpu is None or trial.gpu not in self._ooms:
            return
        now = time.monotonic()
        self._times.ended(self._span(trial, end=now, ok=fail_reason is None))
        self._startups[trial.gpu].see(trial, now, ended=True)
        if gpu_mem_peak_mib is not None:
            self._mem_peaks.append(gpu_mem_peak_mib)
        if fail_reason == "oom":  # decided now, before the slot takes its next trial
            self._ooms[trial.gpu].append(now)
            self._decided_at = -float("inf")
            self.tick(())

    def _span(self, trial: RunningView, end: float | None = None, ok: bool = True) -> Span:
        assert trial.gpu is not None
        return self._times.span(trial.gpu, trial.worker, trial.params, trial.started, end, ok=ok,
                                reports=trial.reports, choices=trial.choices)

    def tick(self, running: Iterable[RunningView]) -> bool:
        """Decide every GPU group's level (at most every _DECIDE_EVERY_S, at once after an
        OOM); True when one changed. ``running`` is read only when a decision is due."""
        now = time.monotonic()
        if not self.pool.auto or now - self._decided_at < _DECIDE_EVERY_S:
            return False
        self._decided_at = now
        running = list(running)
        self._pool_kinds()
        host = replace(self._host(), running=sum(1 for v in running if not v.ended))
        changes: list[Change] = []
        held_changed = False
        for leader, members in self._groups.items():
            state = self.levels[leader]
            seen = {m: self._observe(state, m, running, now) for m in members}
            group = _together(list(seen.values()))
            cores = None if self._threads_configured is not None else self._core_room(
                running, waiting=len(self._pending.keys() - {leader}) + 1, used=group.cpu_cores)
            turn = step(self.policy, state, self._pending.pop(leader, None), group,
                        replace(host, adds=len(members)), cores, now)
            if turn.waiting is not None:
                self._pending[leader] = turn.waiting
            if turn.verdict is not None:  # decided on what it saw: shown in the attr
                self._seen.update(seen)
                held_changed |= turn.verdict.held != state.held
                if _fits_one_more(self.policy, group, host):
                    self._fits_above[leader] = state.limit
            self._set(members, turn.state)
            if turn.change is not None:
                changes += [replace(turn.change, gpu=m) for m in members]
                for m in members:
                    self.pool.set_limit(m, turn.change.new)
                # the next group's decision sees this one's trials
                host = replace(host, concurrency=self.pool.concurrency)
        self._tell(changes)
        if changes or (held_changed and now - self._written_at >= _HELD_WRITE_EVERY_S):
            self._write()
        return bool(changes)

    def _pool_kinds(self) -> None:
        """Past MAX_KINDS kinds every trial is one kind: the levels' durations too, once."""
        if self._times.pooled and not self._pooled:
            self._pooled = True
            self.levels = {index: _pooled(state) for index, state in self.levels.items()}
            self._pending = {group: (_pooled(s), c) for group, (s, c) in self._pending.items()}

    def _host(self) -> HostObservation:
        running_peaks = [] if self.readings is None else [
            p for index in self.levels for p in self.readings.running_mem_peaks(index)]
        return HostObservation(cores=self.cores, concurrency=self.pool.concurrency,
                               cap=self.pool.cap,
                               mem_peak_mib=expected_peak_mib(self._mem_peaks, running_peaks))

    def _tell(self, changes: list[Change]) -> None:
        """Keep the changes for the attr, and a line per group's change for the progress."""
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        self._changes += [{"time": stamp, "gpu": c.gpu, "from": c.old, "to": c.new,
                           "reason": c.reason} for c in changes]
        said: dict[tuple[int, int, str], list[int]] = {}
        for change in changes:
            said.setdefault((change.old, change.new, change.reason), []).append(change.gpu)
        self._notes += [f"{', '.join(f'gpu{g}' for g in gpus)}: {old} -> {new} trials per GPU "
                        f"({reason})" for (old, new, reason), gpus in said.items()]

    def take_notes(self) -> list[str]:
        """The level changes since the last call, a line each, for the run's progress."""
        notes, self._notes = self._notes, []
        return notes

    def _set(self, members: tuple[int, ...], state: GpuLevel) -> None:
        """One state for a group, each GPU's copy under its own index (the attr shows each)."""
        for m in members:
            self.levels[m] = replace(state, gpu=m)

    def workers_wanted(self) -> dict[int, int]:
        """Worker processes each GPU should have: one per place at its level, and a spare for
        the place above (scheduler/_workers.py) while the level may still rise and one more
        trial was seen to fit in GPU memory at this level. Seen once, it holds for the level:
        the spare's own memory (its CUDA context) is the next trial's, not a reason to drop it.
        Spares fill only the places scheduler.parallel leaves, one per GPU in index order: a
        spare beyond them would hold a GPU context for a trial that can never start."""
        room = self.pool.cap - self.pool.concurrency
        wanted = {}
        for leader, members in self._groups.items():
            state = self.levels[leader]
            may = may_rise(self.policy, state) and self._fits_above.get(leader) == state.limit
            for m in members:
                spare = may and room > 0
                room -= int(spare)
                wanted[m] = state.limit + int(spare)
        return wanted

    def close(self) -> None:
        """The final levels and why each stopped where it did."""
        if self.pool.auto:
            self._write()

    def _observe(self, state: GpuLevel, index: int, running: list[RunningView],
                 now: float) -> GpuObservation:
        """What was measured on the GPU since its level was set."""
        here = [v for v in running if v.gpu == index and not v.ended]
        startup = self._startups[index]
        for view in here:
            startup.see(view, now)
        startup.gone({(v.worker, v.started) for v in here}, now)
        over_at = startup.over_at()
        readings = [] if self.readings is None else self.readings.device_readings(index, state.since)
        latest = [] if self.readings is None else self.readings.device_readings(index, now - 30.0)
        # the host's trials' CPU use once their set-up is behind them (imports take a core a
        # trial for seconds), as their steady GPU utilization; since the level was set before
        cpu_since = max(state.since, _steady_since([v for v in running if not v.ended])
                        or state.since)
        return observation(
            index, self.pool.busy_on(index), readings, latest,
            total_mib=self._total_mib.get(index),
            running_mem_mib=tuple(self.readings.running_mem_peaks(index)) if self.readings else (),
            trials=self._times.measured(index, state.since, [self._span(v) for v in here], now),
            # an OOM counts against the level in force when the trial ended
            ooms=sum(1 for t in self._ooms[index] if t >= state.since),
            cpu=[] if self.readings is None else self.readings.cpu_readings(cpu_since),
            min_readings=self.policy.min_readings, running=here, starting=startup.starting,
            after_startup=[] if self.readings is None or over_at is None
            else self.readings.device_readings(index, over_at))

    def _write(self) -> None:
        self._written_at = time.monotonic()
        value = {**self._record,
                 "levels": [{"gpu": s.gpu, "limit": s.limit, "held": s.held, "held_by": s.held_by,
                             "rates": {str(k): v for k, v in sorted(s.rates.items())},
                             "gains": {str(k): v for k, v in sorted(s.gains.items())},
                             **self._last_readings(s.gpu)}
                            for s in self.levels.values()],
                 "changes": self._changes[-_MAX_CHANGES:], "settled": self._settled_now()}
        self.study.set_user_attr(packing_key(self.host), value)

    def _settled_now(self) -> list[dict[str, Any]]:
        """The attr's "settled": the earlier runs' entries, this run's where it settled."""
        settled = dict(self._settled)
        if self.pool.auto:
            for leader in self._groups:
                found = settled_level(self.levels[leader])
                if found is not None:
                    settled[(self.objective, *self._models[leader])] = found
        return [{"objective": objective, "gpu": name, "memory_total_mib": mib, "level": level,
                 "times": {str(k): {kind: list(d) for kind, d in kinds.items()}
                           for k, kinds in sorted(times.items())}}
                for (objective, name, mib), (level, times) in settled.items()]

    def _last_readings(self, index: int) -> dict[str, float | None]:
        """What the last decision saw: GPU utilization and the host cores our trials used."""
        obs = self._seen.get(index)
        if obs is None:
            return {}
        return {"util": None if obs.util is None else round(obs.util, 1),
                "cpu_cores": None if obs.cpu_cores is None else round(obs.cpu_cores, 1)}


def observation(index: int, busy: int, readings: list[DeviceReading],
                latest: list[DeviceReading], total_mib: float | None,
                running_mem_mib: tuple[float, ...], trials: tuple[Any, ...], ooms: int,
                cpu: list[float], min_readings: int, running: list[RunningView],
                starting: bool = False,
                after_startup: list[DeviceReading] | None = None) -> GpuObservation:
    """One GPU's observation from its numbers: ``readings`` since its level was set,
    ``latest`` of the last 30 s (its memory now), the host cores our trials used per
    sampler round (``cpu``, counted from ``min_readings`` rounds), the trials running on it;
    whether its first trials are still ``starting``, and the readings since they are past
    their start-up (``after_startup``; None before: :class:`StartUp`)."""
    utils = [r.sm_util for r in readings if r.sm_util is not None]
    used = next((r.mem_used_mib for r in reversed(latest) if r.mem_used_mib is not None), None)
    steady = _steady(readings, running)
    after = [r.sm_util for r in after_startup or () if r.sm_util is not None]
    return GpuObservation(
        gpu=index, running=busy,
        util=sum(utils) / len(utils) if utils else None, readings=len(utils),
        free_mib=None if used is None or total_mib is None else total_mib - used,
        running_mem_mib=running_mem_mib, trials=trials, ooms=ooms,
        cpu_cores=statistics.fmean(cpu) if len(cpu) >= min_readings else None,
        steady_util=statistics.fmean(steady) if steady else None, steady_readings=len(steady),
        latest_util=tuple(utils[-min_readings:]), starting=starting,
        after_startup_util=statistics.fmean(after) if after else None,
        after_startup_readings=len(after))


@dataclass
class StartUp:
    """A GPU's start-up in this run, for the start-up overlap (placement/_rules.py): it lasts
    until a trial on it reports a step or ends. The trials that started before then are each
    past their own start-up at their first step, or at their end (one that reports none)."""

    ended_at: float | None = None  # when the start-up ended (None: it lasts)
    # (worker pid, started) of each trial that started during it -> when it was past its own
    trials: dict[tuple[int, float], float | None] = field(default_factory=dict)

    @property
    def starting(self) -> bool:
        return self.ended_at is None

    def see(self, trial: RunningView, now: float, ended: bool = False) -> None:
        key = (trial.worker, trial.started)
        if self.ended_at is None or trial.started < self.ended_at:
            self.trials.setdefault(key, None)
        if key not in self.trials or self.trials[key] is not None:
            return
        if trial.reports:
            past = trial.started + min(seconds for _, seconds in trial.reports)
        elif ended:
            past = now
        else:
            return
        self.trials[key] = past
        self.ended_at = past if self.ended_at is None else min(self.ended_at, past)

    def gone(self, running: set[tuple[int, float]], now: float) -> None:
        """Trials of the start-up no longer running, and never said to end (a lost worker),
        are past it now: the level they were started at would wait for them for good."""
        for key, past in self.trials.items():
            if past is None and key not in running:
                self.trials[key] = now
                self.ended_at = now if self.ended_at is None else min(self.ended_at, now)

    def over_at(self) -> float | None:
        """When every trial of the start-up was past its own; None before (or with none)."""
        if self.ended_at is None or not self.trials or None in self.trials.values():
            return None
        return max(t for t in self.trials.values() if t is not None)


def read_settled(entries: Any) -> dict[tuple[str, str, float | None], tuple[int, Times]]:
    """hpo.packing.<host>'s "settled" as the packer keeps it; entries it cannot read (an
    attr edited by hand) are left out, not an error: the run then climbs from one."""
    settled: dict[tuple[str, str, float | None], tuple[int, Times]] = {}
    for entry in entries if isinstance(entries, list) else []:
        try:
            times = {int(k): {str(kind): tuple(float(x) for x in d) for kind, d in kinds.items()}
                     for k, kinds in entry["times"].items()}
            mib = entry["memory_total_mib"]
            key = (str(entry["objective"]), str(entry["gpu"]), None if mib is None else float(mib))
            settled[key] = (int(entry["level"]), times)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return settled


def _fits_one_more(policy: PackingPolicy, obs: GpuObservation, host: HostObservation) -> bool:
    """Was one more trial seen to fit in the GPU's memory? (a spare for the place above)"""
    room = memory_room(policy, obs, host)
    return room is not None and room[0] >= room[1]


def _together(observations: list[GpuObservation]) -> GpuObservation:
    """A group's observation: every GPU's trials; busy places, readings and free memory of the
    GPU with the least (each must have room); OOMs of all; mean utilization, overall, steady
    and after the start-up (known once known on every GPU); starting while every GPU is, its
    latest readings the busiest GPU's at each place (each must read idle)."""
    if len(observations) == 1:
        return observations[0]
    utils = [o.util for o in observations if o.util is not None]
    steady = [o.steady_util for o in observations if o.steady_util is not None]
    after = [o.after_startup_util for o in observations if o.after_startup_util is not None]
    tightest = min(observations, key=lambda o: float("inf") if o.free_mib is None else o.free_mib)
    return GpuObservation(
        gpu=observations[0].gpu, running=min(o.running for o in observations),
        util=statistics.fmean(utils) if len(utils) == len(observations) else None,
        readings=min(o.readings for o in observations),
        free_mib=None if any(o.free_mib is None for o in observations) else tightest.free_mib,
        running_mem_mib=tightest.running_mem_mib,
        trials=tuple(t for o in observations for t in o.trials),
        ooms=sum(o.ooms for o in observations), cpu_cores=observations[0].cpu_cores,
        steady_util=statistics.fmean(steady) if len(steady) == len(observations) else None,
        steady_readings=min(o.steady_readings for o in observations),
        latest_util=_busiest([o.latest_util for o in observations]),
        starting=all(o.starting for o in observations),
        after_startup_util=statistics.fmean(after) if len(after) == len(observations) else None,
        after_startup_readings=min(o.after_startup_readings for o in observations))


def _busiest(latest: list[tuple[float, ...]]) -> tuple[float, ...]:
    """The GPUs' latest readings, place by place from the newest, the busiest GPU's at each;
    as many as the GPU with the fewest has."""
    shortest = min(map(len, latest))
    return tuple(map(max, *(util[len(util) - shortest:] for util in latest))) if shortest else ()


def _steady(readings: list[DeviceReading], running: list[RunningView]) -> list[float]:
    """The GPU's utilization readings since every trial running on it reported its first step:
    what the trials use once their set-up (imports, CUDA context, data) is behind them. None
    before that, or while nothing runs."""
    since = _steady_since(running)
    if since is None:
        return []
    return [r.sm_util for r in readings if r.t >= since and r.sm_util is not None]


def _steady_since(running: list[RunningView]) -> float | None:
    """When the last of the running trials reported its first step; None before, or while
    nothing runs."""
    if not running or any(not v.reports for v in running):
        return None
    return max(v.started + min(s for _, s in v.reports) for v in running)


def _pooled(state: GpuLevel) -> GpuLevel:
    """The GPU's durations so far as one kind (TrialTimes.pooled): kept under their old
    kinds, no trial after the change would meet them, and a level would never be judged."""
    def one(levels: dict[int, dict[str, tuple[float, ...]]]) -> dict[int, dict[str, tuple[float, ...]]]:
        pooled: dict[int, dict[str, tuple[float, ...]]] = {level: {} for level in levels}
        for level, kinds in levels.items():
            for kind, durations in kinds.items():
                key = pooled_kind(kind)
                pooled[level][key] = (*pooled[level].get(key, ()), *durations)[-KEPT_PER_KIND:]
        return pooled
    return replace(state, times=one(state.times), past=one(state.past))
