"""Status's numbers: SQL aggregates over the summarized trials (:mod:`hpo_orchestrator.db._sums`),
with the few trials that have no summary row (running ones, or ones run by something else)
added in Python.

Nothing here reads one row per summarized trial, so ``status`` costs about the same on 1k and
on 1M trials. A median over both kinds of trial reads the summarized values of that column only
when there are trials without a summary row to add to them (a study that plain Optuna also ran).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from sqlalchemy.engine import Connection

from hpo_orchestrator import db
from hpo_orchestrator.db import TrialRow
from hpo_orchestrator.status._model import DeviceUse, StateStats

__all__ = ["busy_seconds", "device_label", "device_use", "listed_devices", "startup",
           "state_stats", "window"]

DeviceKey = tuple[str | None, int | None]


def state_stats(connection: Connection, study_id: int, has_summary: bool, counts: Counter[str],
                states: list[str], extra: list[TrialRow]) -> dict[str, StateStats]:
    """Count, mean, median and longest duration of each of ``states``."""
    sums = db.summary_durations(connection, study_id) if has_summary else {}
    more: dict[str, list[float]] = {}
    for row in extra:
        if row.start_s is not None and row.end_s is not None:
            more.setdefault(row.state, []).append(row.end_s - row.start_s)
    found = {}
    for state in states:
        summed, values = sums.get(state), more.get(state, [])
        stats = StateStats(count=counts.get(state, 0))
        if summed is None and values:
            stats.mean_s, stats.median_s = statistics.fmean(values), statistics.median(values)
            stats.max_s = max(values)
        elif summed is not None:
            n = summed.trials + len(values)
            stats.mean_s = (summed.total_s + math.fsum(values)) / n
            stats.max_s = max([summed.max_s, *values])
            stats.median_s = (statistics.median(
                db.summary_values(connection, study_id, "duration", summed.trials, state) + values)
                if values else db.summary_median(connection, study_id, "duration", summed.trials, state))
        found[state] = stats
    return found


def window(groups: list[db.GroupSums], extra: list[TrialRow],
           now: float) -> tuple[float, float, float] | None:
    """(first start, last start, last end or now): the study's wall time, and the part of it
    in which trials were still waiting to start."""
    spans = [(r.start_s, r.start_s, r.end_s or now) for r in extra if r.start_s is not None]
    spans += [(g.first_start, g.last_start, g.last_end) for g in groups
              if g.first_start is not None and g.last_start is not None and g.last_end is not None]
    if not spans:
        return None
    return min(s[0] for s in spans), max(s[1] for s in spans), max(s[2] for s in spans)


def startup(connection: Connection, study_id: int, groups: list[db.GroupSums],
            extra: list[TrialRow]) -> tuple[int, float | None, float | None]:
    """Medians of start-up and of the time to the first pruning decision, over the trials that
    recorded both: (how many trials, start-up median, first decision median)."""
    pairs = [(r.startup_s, r.first_decision_s) for r in extra
             if r.startup_s is not None and r.first_decision_s is not None]
    n = sum(g.startup_pairs for g in groups)
    if n + len(pairs) == 0:
        return 0, None, None
    if not pairs:
        return (n, db.summary_median(connection, study_id, "startup", n),
                db.summary_median(connection, study_id, "first_decision", n))
    startups = db.summary_values(connection, study_id, "startup", n) + [p[0] for p in pairs]
    decisions = db.summary_values(connection, study_id, "first_decision", n) + [p[1] for p in pairs]
    return n + len(pairs), statistics.median(startups), statistics.median(decisions)


def device_label(host: str | None, gpu: int | None, hosts: int) -> str:
    """gpu0 / cpu, prefixed with the host when the study ran on several."""
    device = "cpu" if gpu is None else f"gpu{gpu}"
    return f"{host}:{device}" if hosts > 1 and host else device


def listed_devices(study_attrs: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """host -> its GPUs, as each orchestrator recorded them (study attr hpo.devices.<host>), so
    a GPU that never got a trial still shows up."""
    return {key.removeprefix("hpo.devices."): devices or [] for key, devices in study_attrs.items()
            if key.startswith("hpo.devices.")}


def device_use(connection: Connection, study_id: int, groups: list[db.GroupSums],
               extra: list[TrialRow], study_attrs: dict[str, Any], now: float,
               span: tuple[float, float, float] | None) -> list[DeviceUse]:
    """Per device: its trials by state, its busy share of the study's time, its utilization
    (trial-time weighted) and energy. ``groups``: db.summary_group_sums of the study."""
    listed = listed_devices(study_attrs)
    sums = [g for g in groups if g.on_device]
    hosts = {s.host for s in sums if s.host} | {r.host for r in extra if r.host} | set(listed)
    members: dict[DeviceKey, list[TrialRow]] = {}
    for row in extra:
        if row.host is not None or row.gpu_index is not None:  # run by an orchestrator
            members.setdefault((row.host, row.gpu_index), []).append(row)
    summed: dict[DeviceKey, list[db.GroupSums]] = {}
    for s in sorted(sums, key=lambda s: s.first_trial_id):
        summed.setdefault((s.host, s.gpu_index), []).append(s)
    inventory: dict[DeviceKey, DeviceUse] = {}
    for key in [*((h, g["index"]) for h, devices in listed.items() for g in devices), *summed, *members]:
        inventory.setdefault(key, DeviceUse(device_label(key[0], key[1], len(hosts)), key[0], key[1]))
    if span is None:
        return sorted(inventory.values(), key=lambda d: d.device)

    lo, queued_hi, hi = span
    intervals = db.summary_intervals(connection, study_id, now) if summed else {}
    for key, rows in members.items():
        intervals.setdefault(key, []).extend((r.start_s, r.end_s or now) for r in rows
                                             if r.start_s is not None)
    for key, use in inventory.items():
        rows, groups = members.get(key, []), summed.get(key, [])
        use.trials = sum(g.trials for g in groups) + len(rows)
        states: Counter[str] = Counter()
        for g in groups:
            states[g.state] += g.trials
        states.update(r.state for r in rows)
        use.states = dict(states)
        covered, queued = busy_seconds(intervals.get(key, []), lo, queued_hi, hi)
        if hi > lo:
            use.busy_fraction = covered / (hi - lo)
        if queued_hi > lo:
            use.busy_fraction_queued = queued / (queued_hi - lo)
        use.util_mean = _weighted(groups, rows, now, compute=False)
        use.util_compute_mean = _weighted(groups, rows, now, compute=True)
        energy = [r.energy_j for r in rows if r.energy_j is not None]
        energy_trials = sum(g.energy_trials for g in groups) + len(energy)
        if energy_trials:
            use.energy_kj = round((sum(g.energy_j or 0.0 for g in groups) + sum(energy)) / 1000, 3)
    return sorted(inventory.values(), key=lambda d: d.device)


def busy_seconds(intervals: list[tuple[float, float]], lo: float, queued_hi: float,
                 hi: float) -> tuple[float, float]:
    """Seconds covered by at least one interval within [lo, hi] and within [lo, queued_hi].

    One sweep over the sorted intervals (plain comparisons: this runs over every trial).
    """
    busy = queued = 0.0
    cursor = lo
    for start, end in sorted(intervals):
        if start < cursor:
            start = cursor
        if end > hi:
            end = hi
        if end <= start:
            continue
        busy += end - start
        if start < queued_hi:
            queued += (end if end < queued_hi else queued_hi) - start
        cursor = end
    return busy, queued


def _weighted(groups: list[db.GroupSums], rows: list[TrialRow], now: float,
              compute: bool) -> float | None:
    """Mean GPU utilization over trials, weighted by each trial's duration."""
    total = sum((g.compute_weighted if compute else g.util_weighted) or 0.0 for g in groups)
    weight = sum((g.compute_weight if compute else g.util_weight) or 0.0 for g in groups)
    for row in rows:
        value = row.util_compute_mean if compute else row.util_mean
        if value is not None and row.start_s is not None:
            w = (row.end_s or now) - row.start_s
            total += value * w
            weight += w
    return round(total / weight, 1) if weight > 0 else None
