"""What the report draws, gathered with plain SQL and shaped for charts.

Both renderers (HTML with plotly, PNG with matplotlib) draw the same :class:`ReportData`, so
what a chart shows is decided here, once. Times are seconds since the study's first trial
started, so the timeline and the utilization chart share one axis.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy.engine import Connection, Engine

from hpo_orchestrator import db
from hpo_orchestrator.db import TrialRow
from hpo_orchestrator.status import StatusReport, collect, device_label

__all__ = ["CPU_AXIS", "Bar", "ReportData", "Series", "collect_report", "lane_device", "lane_name",
           "no_pruned_trial", "prune_histogram"]

# Most points drawn per utilization line: samples are averaged into buckets beyond that.
_MAX_POINTS = 1500
# The CPU chart's unit: cores, summed over the trials (a trial's cpu_util is % of one core,
# so several trials' sum read as "% of one core" went past 100 % x the host's cores).
CPU_AXIS = "cores in use (all trials)"


@dataclass(frozen=True)
class Bar:
    """One trial on the timeline: a lane of its device, from start to end."""

    lane: str
    number: int
    state: str
    start: float  # seconds since the study's first start
    end: float
    value: float | None
    last_step: int | None


@dataclass(frozen=True)
class Series:
    """One device's utilization over time (bucket means)."""

    device: str
    t: list[float]
    util: list[float]


@dataclass
class ReportData:
    study: str
    direction: str
    status: StatusReport
    started_utc: datetime | None  # the study's first trial start (t = 0 on the time axes)
    lanes: list[str] = field(default_factory=list)  # timeline rows, top to bottom
    bars: list[Bar] = field(default_factory=list)
    utilization: list[Series] = field(default_factory=list)
    utilization_kind: str = "gpu"  # gpu: SM % per GPU; cpu: summed CPU % of the trials per host
    prune_steps: dict[int, int] = field(default_factory=dict)
    history: list[tuple[int, float]] = field(default_factory=list)  # COMPLETE: (number, value)
    best_so_far: list[tuple[int, float]] = field(default_factory=list)
    # The charts of trials (timeline, utilization, history) draw trials from this number on:
    # the newest ``last`` of a large study (collect_report); the summary covers every trial.
    first_number: int = 0


def collect_report(engine: Engine, study: str | None, last: int | None = None) -> ReportData:
    """The summary of every trial, and the charts of every trial or of the newest ``last``."""
    with db.read_errors(), engine.connect() as connection:
        status = collect(connection, study)
        study_id, name = db.study_id_of(connection, status.study)
        first = db.first_of_last(connection, study_id, last)
        rows = db.trial_rows(connection, study_id, first)
        values = db.trial_values(connection, study_id, first)
        samples = _samples(connection, study_id, first) if db.has_telemetry_table(connection) else []
    starts = [r.start_s for r in rows if r.start_s is not None]
    origin = min(starts) if starts else 0.0
    several = len(status.directions) > 1
    # Several objectives: the history shows the first; no single "best so far" exists (the
    # summary lists the Pareto front instead).
    direction = f"objective 0 of {len(status.directions)}, {status.direction}" if several \
        else status.direction
    data = ReportData(study=name, direction=direction, status=status,
                      started_utc=datetime.fromtimestamp(origin, tz=UTC) if starts else None,
                      prune_steps=status.prune_steps, first_number=first)
    hosts = {r.host for r in rows if r.host}
    data.lanes, data.bars = _timeline(rows, values, origin, len(hosts))
    data.utilization_kind = "gpu" if any(s.gpu is not None for s in samples) else "cpu"
    data.utilization = _utilization(samples, origin, data.utilization_kind, len(hosts))
    data.history = sorted((r.number, values[r.number]) for r in rows
                          if r.state == "COMPLETE" and values.get(r.number) is not None)
    data.best_so_far = [] if several else _best_so_far(data.history, status.direction)
    return data


class _Sample(NamedTuple):
    epoch: float
    trial: int
    gpu: int | None
    sm_util: float | None  # the whole card's SM utilization
    cpu_util: float | None  # the trial's process tree, % of one core
    host: str | None


def _samples(connection: Connection, study_id: int, first: int) -> list[_Sample]:
    return [_Sample(s.ts.replace(tzinfo=UTC).timestamp(),  # stored as naive UTC
                    s.trial_id, s.gpu_index, s.sm_util, s.cpu_util, s.host)
            for s in db.telemetry_samples(connection, study_id, first)]


def _timeline(rows: list[TrialRow], values: dict[int, float], origin: float,
              hosts: int) -> tuple[list[str], list[Bar]]:
    """Trials per device, in lanes: a trial takes the first lane of its device that is free
    at its start, so trials sharing a GPU sit on parallel lanes and idle time shows as gaps."""
    now = max((r.end_s or r.start_s or 0.0) for r in rows) if rows else 0.0
    lane_ends: dict[str, list[float]] = {}
    bars = []
    for row in sorted((r for r in rows if r.start_s is not None), key=lambda r: r.start_s or 0.0):
        assert row.start_s is not None
        device = device_label(row.host, row.gpu_index, hosts)
        ends = lane_ends.setdefault(device, [])
        end = row.end_s if row.end_s is not None else now
        lane = next((i for i, busy_until in enumerate(ends) if busy_until <= row.start_s), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        bars.append(Bar(lane=lane_name(device, lane), number=row.number, state=row.state,
                        start=row.start_s - origin, end=end - origin,
                        value=values.get(row.number), last_step=row.last_step))
    lanes = [lane_name(device, i) for device in sorted(lane_ends)
             for i in range(len(lane_ends[device]))]
    return lanes, bars


def lane_name(device: str, lane: int) -> str:
    """A timeline row, named as the run names its slots: CPU slots are cpu0, cpu1, ...
    (one trial each); a GPU's slots are all gpuN, so its rows are gpuN #1, #2, ..."""
    return f"{device}{lane}" if device.rsplit(":", 1)[-1] == "cpu" else f"{device} #{lane + 1}"


def lane_device(lane: str) -> str:
    """The device of a timeline row (lane_name's inverse)."""
    return lane.rsplit(" #", 1)[0] if " #" in lane else lane.rstrip("0123456789")


def _utilization(samples: list[_Sample], origin: float, kind: str,
                 hosts: int) -> list[Series]:
    """Bucket means per device, at most _MAX_POINTS buckets.

    GPU: the card's SM utilization; trials sharing a card read the same card, so their
    readings are averaged. CPU: different trials use different cores, so a bucket's value is
    the cores in use, the sum over trials of each trial's mean (% of one core / 100) times the
    share of the bucket it ran (its samples x the sampling interval): a trial that ended and
    the next one on its slot within one bucket count once, not twice.
    """
    if not samples:
        return []
    width = max(1.0, (samples[-1].epoch - samples[0].epoch) / _MAX_POINTS)
    interval = _sampling_interval(samples)
    # device -> bucket -> trial -> readings
    buckets: dict[str, dict[int, dict[int, list[float]]]] = {}
    for sample in samples:
        reading = sample.sm_util if kind == "gpu" else sample.cpu_util
        if reading is None or (kind == "gpu" and sample.gpu is None):
            continue
        device = device_label(sample.host, sample.gpu if kind == "gpu" else None, hosts)
        bucket = int((sample.epoch - origin) // width)
        buckets.setdefault(device, {}).setdefault(bucket, {}).setdefault(
            sample.trial, []).append(float(reading))
    series = []
    for device in sorted(buckets):
        per_bucket = buckets[device]
        t = sorted(per_bucket)
        if kind == "gpu":
            util = [statistics.fmean(r for readings in per_bucket[b].values() for r in readings)
                    for b in t]
        else:
            util = [sum(statistics.fmean(readings) / 100 * min(1.0, len(readings) * interval / width)
                        for readings in per_bucket[b].values()) for b in t]
        series.append(Series(device=device, t=[(b + 0.5) * width for b in t], util=util))
    return series


def _sampling_interval(samples: list[_Sample]) -> float:
    """The telemetry interval, as sampled: the median gap between a trial's readings."""
    last: dict[tuple[int, int | None], float] = {}
    gaps = []
    for sample in samples:
        key = (sample.trial, sample.gpu)
        if key in last and sample.epoch > last[key]:
            gaps.append(sample.epoch - last[key])
        last[key] = sample.epoch
    return statistics.median(gaps) if gaps else 1.0


def _best_so_far(history: list[tuple[int, float]], direction: str) -> list[tuple[int, float]]:
    best: float | None = None
    result = []
    for number, value in history:
        if best is None or (value < best if direction == "minimize" else value > best):
            best = value
        result.append((number, best))
    return result


def no_pruned_trial(data: ReportData) -> str | None:
    """The prune-step panel in words when no trial was pruned ("title: what happened"): a
    chart of nothing would be an empty frame. None when there is something to draw."""
    if prune_histogram(data)[0]:
        return None
    finished = sum(data.status.states[s].count for s in ("COMPLETE", "PRUNED", "FAIL")
                   if s in data.status.states)
    what = ("no trial has finished yet" if not finished else
            "the one finished trial was not pruned" if finished == 1 else
            f"none of the {finished} finished trials was pruned")
    return f"Where trials were pruned: {what}."


def prune_histogram(data: ReportData) -> tuple[list[int], list[int]]:
    """Steps at which trials were pruned, and how many at each: every step from 0 to the
    last step a completed trial reached, so early pruning shows as bars at the far left."""
    if not data.prune_steps:
        return [], []
    full = max((b.last_step for b in data.bars if b.state == "COMPLETE" and b.last_step is not None),
               default=0)  # how far a trial that was not pruned went: the axis shows all of it
    steps = list(range(min(0, *data.prune_steps), max(full, *data.prune_steps) + 1))
    counts = Counter(data.prune_steps)
    return steps, [counts.get(s, 0) for s in steps]
