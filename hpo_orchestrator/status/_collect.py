"""Status from plain SQL over the storage (through :mod:`hpo_orchestrator.db`): never loads
every trial through the ORM. A study with a kept tally is read by :mod:`._kept` instead; the
visit of every trial here is what it falls back to, and what ``report`` reads.

The db package hands back one narrow row per trial and a few pre-filtered facts; durations,
device use and prune steps are computed here, and turned into findings by
:mod:`hpo_orchestrator.status._findings`.
"""

from __future__ import annotations

import gc
import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import db, keys
from hpo_orchestrator.db import TrialRow
from hpo_orchestrator.status._common import (
    device_choices_of,
    device_label,
    failures_of,
    hosts_of,
    listed_devices,
    packing_of,
    pareto,
    running_of,
)
from hpo_orchestrator.status._findings import find_all
from hpo_orchestrator.status._kept import collect_kept
from hpo_orchestrator.status._model import DeviceUse, Finding, StateStats, StatusReport, StudyFacts

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hpo_orchestrator.db import Readable as Connection

__all__ = ["collect_status", "collect_status_sqlite", "collect_with_rows", "device_label"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "QUEUED", "WAITING")


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """One row object per trial and nothing cyclic: the cycle collector would only rescan them
    (20 % of the time on 100k trials), so it is paused while they are built."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc_was_enabled:
            gc.enable()


def collect_status(engine: Engine, study: str | None) -> StatusReport:
    """From the study's kept tally (status/_kept.py) when it has a good one, else by visiting
    every trial."""
    with _cycle_collector_paused(), db.read_errors(), engine.connect() as connection:
        return _collect(connection, study, kept=True)[0]


def collect_status_sqlite(connection: sqlite3.Connection, study: str | None) -> StatusReport | None:
    """From the study's kept tally over a plain sqlite3 connection (db/_sql.py: no SQLAlchemy
    import); None when the study has no tally status can trust (the caller then opens an
    engine: the visit of every trial reads through SQLAlchemy). One read transaction, so every
    statement sees the same snapshot."""
    with _cycle_collector_paused(), db.read_errors():
        connection.execute("BEGIN")
        try:
            return _collect(connection, study, kept=True, only_kept=True)[0]
        except _NotKept:
            return None
        finally:
            connection.execute("COMMIT")


class _NotKept(Exception):
    """The study has no tally status can trust."""


def collect_with_rows(connection: Connection, study: str | None) -> tuple[StatusReport, list[TrialRow]]:
    """The report and the trial rows it was made from (the report draws them again: one read)."""
    with _cycle_collector_paused():
        return _collect(connection, study)


def _collect(connection: Connection, study: str | None, kept: bool = False,
             only_kept: bool = False) -> tuple[StatusReport, list[TrialRow]]:
    study_id, name = db.study_id_of(connection, study)
    directions = db.study_directions(connection, study_id) or ["minimize"]
    direction = directions[0]
    study_attrs = db.study_attrs(connection, study_id)
    unreadable = study_attrs.pop(db.UNREADABLE, [])
    config = study_attrs.get(keys.CONFIG) or {}
    db_now = db.database_now(connection)
    now = time.time()
    if kept:
        report = collect_kept(connection, study_id, name, directions, study_attrs, db_now, now)
        if report is not None:
            return _note_unreadable(report, unreadable), []
    if only_kept:
        raise _NotKept
    has_summary = db.has_summary_table(connection)

    counts = Counter(db.state_counts(connection, study_id))
    rows = db.summary_rows(connection, study_id) if has_summary else []
    uncovered = db.uncovered_trials(connection, study_id, has_summary)
    rows += [u.row for u in uncovered]
    hosts = len(hosts_of(rows, listed_devices(study_attrs)))
    running, queued = running_of(connection, uncovered, db_now, now, config, hosts)
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
    prune_rate = counts["PRUNED"] / finished if finished else None

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

    window = _window(rows, now)
    placed = [r for r in rows if r.state != "RUNNING" or r.number not in queued]
    failed_trials = failures_of(db.fail_errors(connection, study_id) if counts["FAIL"] else {})
    failures = failed_trials.listed
    objective_failures = [n for n, reason, _ in failures if reason != "interrupted"]
    report = StatusReport(
        study=name, direction=direction,
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=prune_rate, prune_steps=dict(sorted(prune_steps.items())),
        best=db.best_trial(connection, study_id, direction) if len(directions) == 1 else None,
        directions=directions, best_trials=pareto(connection, study_id, directions),
        per_device=_device_use(placed, study_attrs, now, window),
        running=running, fail_reasons=failed_trials.reasons,
        wall_s=None if window is None else window[2] - window[0], queued=queued,
        active_s=_active(placed, now, window),
        retried=failed_trials.rerun, never_ran=failed_trials.never_ran,
        min_resource_auto=study_attrs.get(keys.PRUNER_MIN_RESOURCE_AUTO),
        pruner_tune=(config.get("pruner") or {}).get("tune") == "auto",
        pruner_history=study_attrs.get(keys.PRUNER_HISTORY) or [],
        pruner_tuning=study_attrs.get(keys.PRUNER_TUNING),
        last_failed=max(objective_failures) if objective_failures else None,
        packing=packing_of(study_attrs), device_choices=device_choices_of(study_attrs))
    report.findings = find_all(report, StudyFacts(
        config=config, rows=rows, unverified=sorted(unverified), mismatches=sorted(mismatches),
        max_complete_step=None if max_complete_step is None else int(max_complete_step),
        failures=failures))
    return _note_unreadable(report, unreadable), rows


def _note_unreadable(report: StatusReport, names: list[str]) -> StatusReport:
    """Study attrs of a shape we never write (db/_attr_shapes.py) were left out: say which."""
    if names:
        report.findings.append(Finding(
            "unreadable_attr", "warning",
            f"study attrs of a shape this package never writes were left out: {', '.join(names)}",
            "something else wrote them (optuna study set-user-attr, another program on a shared "
            "database); the rest of the study reads as usual", {"attrs": names}))
    return report








def _busy_seconds(intervals: list[tuple[float, float]], lo: float, queued_hi: float,
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








def _active(rows: list[TrialRow], now: float,
            window: tuple[float, float, float] | None) -> float | None:
    """Seconds with a trial running on the study's device, when it had one (every CPU slot
    of a host is one device): the union of its trials' intervals. With several, None, as
    status/_kept.py, whose tally keeps one union per device and none across them."""
    devices = {(r.host, r.gpu_index) for r in rows if r.host is not None or r.gpu_index is not None}
    if window is None or len(devices) != 1:
        return None
    intervals = [(r.start_s, r.end_s or now) for r in rows
                 if r.start_s is not None and (r.host is not None or r.gpu_index is not None)]
    return _busy_seconds(intervals, window[0], window[1], window[2])[0]


def _window(rows: list[TrialRow], now: float) -> tuple[float, float, float] | None:
    """(first start, last start, last end or now): the study's wall time, and the part of it
    in which trials were still waiting to start."""
    starts = [r.start_s for r in rows if r.start_s is not None]
    if not starts:
        return None
    return min(starts), max(starts), max(r.end_s or now for r in rows if r.start_s is not None)


def _device_use(rows: list[TrialRow], study_attrs: dict[str, Any], now: float,
                window: tuple[float, float, float] | None) -> list[DeviceUse]:
    listed = listed_devices(study_attrs)
    hosts = hosts_of(rows, listed)
    DeviceKey = tuple[str | None, int | None]
    by_device: dict[DeviceKey, list[TrialRow]] = {}
    for row in rows:
        if row.host is not None or row.gpu_index is not None:  # run by an orchestrator
            by_device.setdefault((row.host, row.gpu_index), []).append(row)
    inventory: dict[DeviceKey, DeviceUse] = {}
    for key in [*((h, g["index"]) for h, devices in listed.items() for g in devices), *by_device]:
        inventory.setdefault(key, DeviceUse(device_label(key[0], key[1], len(hosts)), key[0], key[1]))

    if window is None:
        return sorted(inventory.values(), key=lambda d: d.device)
    study_lo, queued_hi, study_hi = window
    for key, use in inventory.items():
        members = by_device.get(key, [])
        use.trials = len(members)
        use.states = dict(Counter(r.state for r in members))
        intervals = [(r.start_s, r.end_s or now) for r in members if r.start_s is not None]
        busy, queued = _busy_seconds(intervals, study_lo, queued_hi, study_hi)
        if study_hi > study_lo:
            use.busy_fraction = busy / (study_hi - study_lo)
        if queued_hi > study_lo:
            use.busy_fraction_queued = queued / (queued_hi - study_lo)
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
