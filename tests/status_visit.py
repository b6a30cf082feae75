"""Status by visiting every trial of the study: the tests' oracle for status/_collect.py.

Status folds the trials into the study's tally, its kept one (a row of sums, the trials since
it, index reads for medians) or a fresh one; this computes the same report the plain way, from
every trial's row as the database has it (counts by state, durations and their medians, the
union of each device's intervals, the flagged and failed trials, the best trial), so that a
test can hold either fold to the database's numbers (tests/tally/test_tally.py).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import db, keys
from hpo_orchestrator.db import TrialRow
from hpo_orchestrator.status import DeviceUse, StateStats, StatusReport, StudyFacts, device_label
from hpo_orchestrator.status._collect import (
    _note_unreadable,
    _pareto,
    _per_host,
    listed_devices,
    running_of,
)
from hpo_orchestrator.status._findings import find_all

if TYPE_CHECKING:
    from hpo_orchestrator.db import Readable as Connection

__all__ = ["visit"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "QUEUED", "WAITING")


def visit(connection: Connection, study: str | None) -> StatusReport:
    """The report of ``study`` from every trial's row (``time.time`` is "now", as status's)."""
    study_id, name = db.study_id_of(connection, study)
    directions = db.study_directions(connection, study_id) or ["minimize"]
    direction = directions[0]
    study_attrs = db.study_attrs(connection, study_id)
    unreadable = study_attrs.pop(db.UNREADABLE, [])
    config = study_attrs.get(keys.CONFIG) or {}
    db_now = db.database_now(connection)
    now = time.time()
    has_summary = db.has_summary_table(connection)

    counts = Counter(db.state_counts(connection, study_id))
    rows = db.summary_rows(connection, study_id) if has_summary else []
    uncovered = db.uncovered_trials(connection, study_id, has_summary)
    rows += [u.row for u in uncovered]
    listed = listed_devices(study_attrs)
    hosts = {r.host for r in rows if r.host} | set(listed)
    running, queued = running_of(connection, uncovered, db_now, now, config, len(hosts))
    if queued:
        counts["RUNNING"] -= len(queued)
        counts["QUEUED"] = len(queued)

    durations: dict[str, list[float]] = {}
    for row in rows:
        if row.start_s is not None and row.end_s is not None:
            durations.setdefault(row.state, []).append(row.end_s - row.start_s)
    states = {}
    for state in (*_STATES, *sorted(set(counts) - set(_STATES))):
        values = durations.get(state, [])
        states[state] = StateStats(count=counts.get(state, 0),
                                   mean_s=statistics.fmean(values) if values else None,
                                   median_s=statistics.median(values) if values else None,
                                   max_s=max(values) if values else None)
    finished = counts["COMPLETE"] + counts["PRUNED"] + counts["FAIL"]

    prune_steps: Counter[int] = Counter()
    max_complete_step = None
    if has_summary:
        prune_steps.update(db.summary_prune_steps(connection, study_id))
        max_complete_step = db.summary_max_complete_step(connection, study_id)
    for u in uncovered:
        if u.row.last_step is not None and u.row.state == "PRUNED":
            prune_steps[u.row.last_step] += 1
        if u.row.last_step is not None and u.row.state == "COMPLETE":
            max_complete_step = max(max_complete_step or 0, u.row.last_step)

    unverified: list[tuple[int, str | None]] = []
    mismatches: list[tuple[int, dict[str, Any]]] = []
    if has_summary:
        for flags in db.summary_flags(connection, study_id):
            if flags.gpu_verified is not None and not flags.gpu_verified:
                unverified.append((flags.number, flags.opencl_platform))
            if flags.params_mismatch:
                mismatches.append((flags.number, flags.params_mismatch))
    for u in uncovered:
        if u.attrs.get(keys.GPU_VERIFIED) is False:
            unverified.append((u.row.number, u.attrs.get(keys.OPENCL_PLATFORM)))
        if u.attrs.get(keys.PARAMS_MISMATCH):
            mismatches.append((u.row.number, u.attrs[keys.PARAMS_MISMATCH]))

    pairs = [(r.startup_s, r.first_decision_s) for r in rows
             if r.startup_s is not None and r.first_decision_s is not None]
    startup = (len(pairs), statistics.median(p[0] for p in pairs),
               statistics.median(p[1] for p in pairs)) if pairs else None
    window = _window(rows, now)
    placed = [r for r in rows if r.state != "RUNNING" or r.number not in queued]
    active = _host_active(placed, now, window)
    # FAIL trials only; one asked ahead that no slot took (retried, no hpo.pid) never ran
    failed = db.fail_errors(connection, study_id) if counts["FAIL"] else {}
    ran = {n: a for n, a in failed.items() if not (a.get(keys.RETRIED) is True and keys.PID not in a)}
    failures = sorted((n, a.get(keys.FAIL_REASON), a.get(keys.ERROR))
                      for n, a in ran.items() if a.get(keys.RETRIED) is not True)
    reasons = Counter(str(a[keys.FAIL_REASON]) for a in ran.values() if a.get(keys.FAIL_REASON))
    objective_failures = [n for n, reason, _ in failures if reason != "interrupted"]
    report = StatusReport(
        study=name, direction=direction,
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=counts["PRUNED"] / finished if finished else None,
        prune_steps=dict(sorted(prune_steps.items())),
        best=db.best_trial(connection, study_id, direction) if len(directions) == 1 else None,
        directions=directions, best_trials=_pareto(connection, study_id, directions),
        per_device=_device_use(placed, listed, now, window, active),
        running=running, fail_reasons=dict(sorted(reasons.items())),
        wall_s=None if window is None else window[2] - window[0], queued=queued,
        active_s=next(iter(active.values()))[0] if len(active) == 1 else None,
        retried=sum(a.get(keys.RETRIED) is True for a in ran.values()),
        never_ran=len(failed) - len(ran),
        min_resource_auto=study_attrs.get(keys.PRUNER_MIN_RESOURCE_AUTO),
        pruner_tune=(config.get("pruner") or {}).get("tune") == "auto",
        pruner_history=study_attrs.get(keys.PRUNER_HISTORY) or [],
        pruner_tuning=study_attrs.get(keys.PRUNER_TUNING),
        last_failed=max(objective_failures) if objective_failures else None,
        packing=_per_host(study_attrs, keys.PACKING_PREFIX),
        device_choices=_per_host(study_attrs, keys.DEVICE_CHOICE_PREFIX))
    report.findings = find_all(report, StudyFacts(
        config=config, unverified=sorted(unverified), mismatches=sorted(mismatches),
        max_complete_step=None if max_complete_step is None else int(max_complete_step),
        failures=failures, startup=startup))
    return _note_unreadable(report, unreadable)


def _busy_seconds(intervals: list[tuple[float, float]], lo: float, queued_hi: float,
                  hi: float) -> tuple[float, float]:
    """Seconds covered by at least one interval within [lo, hi] and within [lo, queued_hi]."""
    busy = queued = 0.0
    cursor = lo
    for start, end in sorted(intervals):
        start, end = max(start, cursor), min(end, hi)
        if end <= start:
            continue
        busy += end - start
        if start < queued_hi:
            queued += min(end, queued_hi) - start
        cursor = end
    return busy, queued


def _placed_intervals(rows: list[TrialRow], now: float) -> list[tuple[float, float]]:
    return [(r.start_s, r.end_s or now) for r in rows
            if r.start_s is not None and (r.host is not None or r.gpu_index is not None)]


def _host_active(rows: list[TrialRow], now: float,
                 window: tuple[float, float, float] | None) -> dict[str | None, tuple[float, float, float]]:
    """Per host: seconds with a trial of the study running on one of its devices, all of
    them and up to the host's last start, and that last start."""
    found = {}
    if window is None:
        return found
    for host in {r.host for r in rows if r.host is not None or r.gpu_index is not None}:
        intervals = _placed_intervals([r for r in rows if r.host == host], now)
        if intervals:
            last_start = max(start for start, _ in intervals)
            found[host] = (*_busy_seconds(intervals, window[0], last_start, window[2]), last_start)
    return found


def _window(rows: list[TrialRow], now: float) -> tuple[float, float, float] | None:
    """(first start, last start, last end or now)."""
    starts = [r.start_s for r in rows if r.start_s is not None]
    if not starts:
        return None
    return min(starts), max(starts), max(r.end_s or now for r in rows if r.start_s is not None)


def _device_use(rows: list[TrialRow], listed: dict[str, list[dict[str, Any]]], now: float,
                window: tuple[float, float, float] | None,
                active: dict[str | None, tuple[float, float, float]]) -> list[DeviceUse]:
    """Busy as a share of the time the study had a trial running on the device's host
    (``active``), and up to the host's last start."""
    hosts = {r.host for r in rows if r.host} | set(listed)
    by_device: dict[tuple[str | None, int | None], list[TrialRow]] = {}
    for row in rows:
        if row.host is not None or row.gpu_index is not None:  # run by an orchestrator
            by_device.setdefault((row.host, row.gpu_index), []).append(row)
    inventory: dict[tuple[str | None, int | None], DeviceUse] = {}
    for key in [*((h, g["index"]) for h, devices in listed.items() for g in devices), *by_device]:
        inventory.setdefault(key, DeviceUse(device_label(key[0], key[1], len(hosts)), key[0], key[1]))
    if window is None:
        return sorted(inventory.values(), key=lambda d: d.device)
    study_lo, _, study_hi = window
    for key, use in inventory.items():
        members = by_device.get(key, [])
        use.trials = len(members)
        use.states = dict(Counter(r.state for r in members))
        intervals = [(r.start_s, r.end_s or now) for r in members if r.start_s is not None]
        if key[0] in active:
            use.active_s, use.active_queued_s, host_last_start = active[key[0]]
            busy, queued = _busy_seconds(intervals, study_lo, host_last_start, study_hi)
            if use.active_s > 0:
                use.busy_fraction = busy / use.active_s
            if use.active_queued_s > 0:
                use.busy_fraction_queued = queued / use.active_queued_s
        use.util_mean = _weighted(members, now, compute=False)
        use.util_compute_mean = _weighted(members, now, compute=True)
        energy = [r.gpu_energy_j for r in members if r.gpu_energy_j is not None]
        use.energy_kj = round(sum(energy) / 1000, 3) if energy else None
    return sorted(inventory.values(), key=lambda d: d.device)


def _weighted(rows: list[TrialRow], now: float, compute: bool) -> float | None:
    """Mean GPU utilization over trials, weighted by each trial's duration."""
    total = weight = 0.0
    for row in rows:
        value = row.gpu_util_compute_mean if compute else row.gpu_util_mean
        if value is not None and row.start_s is not None:
            w = (row.end_s or now) - row.start_s
            total += value * w
            weight += w
    return round(total / weight, 1) if weight > 0 else None
