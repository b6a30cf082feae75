"""Status from the study's kept tally (study/_tally.py): one row, the trials since its
watermark, and a few index reads of ``hpo_trial_summary`` (medians as an OFFSET, the flagged and
failed trials), so its cost grows with the trials since the last trial's end, not with the study.

The numbers are the ones :mod:`._collect` gets by visiting every trial (tests/test_tally.py
compares the two); when the tally is missing, of another version, or does not match the summary
rows it counts, ``collect_kept`` returns None and status visits every trial.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import db, keys
from hpo_orchestrator.status._common import (
    device_choices_of,
    device_label,
    failures_of,
    listed_devices,
    packing_of,
    pareto,
    running_of,
)
from hpo_orchestrator.status._findings import find_all
from hpo_orchestrator.status._model import DeviceUse, StateStats, StatusReport, StudyFacts
from hpo_orchestrator.study import TALLY_VERSION, Tally, trusted_tally

if TYPE_CHECKING:
    from hpo_orchestrator.db import Readable as Connection

__all__ = ["collect_kept"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "QUEUED", "WAITING")


def _tally_of(connection: Connection, study_id: int, name: str) -> Tally | None:
    """The study's tally if status can trust it (study/_tally.py's ``trusted``)."""
    if not db.has_tally_table(connection) or not db.has_summary_table(connection):
        return None  # a copy without the summary (test_telemetry.py's "plain" study)
    stored = db.read_tally(connection, study_id)
    if stored is None or stored[0] != TALLY_VERSION:
        return None
    tally = Tally.from_json(stored[1])
    return tally if trusted_tally(connection, study_id, name, tally) else None


def _median(window: Callable[[int, int], list[float]], stored: int, extra: list[float]) -> float | None:
    """statistics.median of ``stored`` values read in order (``window(offset, limit)``) and of
    ``extra``, reading at most len(extra) + 2 of the stored ones: the k-th of both is among the
    stored k-m-th to k+1-th (m = len(extra)), as every stored value below that range has fewer
    than k values under it and every one above more than k+1."""
    extra = sorted(extra)
    n = stored + len(extra)
    if n == 0:
        return None
    low = (n - 1) // 2  # the middle one (odd n) or the lower of the two (even n)
    first = max(0, low - len(extra))
    last = min(stored, n // 2 + 1)
    merged = sorted((window(first, last - first) if last > first else []) + extra)
    if n % 2:
        return merged[low - first]
    return (merged[low - first] + merged[low + 1 - first]) / 2


def collect_kept(connection: Connection, study_id: int, name: str, directions: list[str],
                 study_attrs: dict[str, Any], db_now: datetime | None,
                 now: float) -> StatusReport | None:
    """The report _collect.py would make, from the tally plus the trials since it (folded into
    this in-memory copy, running ones up to ``now``); None when there is no tally to trust."""
    tally = _tally_of(connection, study_id, name)
    if tally is None:
        return None
    config = study_attrs.get(keys.CONFIG) or {}
    since = db.trials_since(connection, study_id, tally.watermark, tally.holes)
    listed = listed_devices(study_attrs)
    hosts = {d.host for d in tally.devices if d.host} | {t.row.host for t in since if t.row.host} \
        | set(listed)
    uncovered = [db.UncoveredTrial(t.trial_id, t.row, t.attrs) for t in since if not t.summarized]
    running, queued = running_of(connection, uncovered, db_now, now, config, len(hosts))

    folded = {state: int(n) for state, (n, _, _) in tally.durations.items()}
    folded_pairs = tally.pairs
    durations: dict[str, list[float]] = {}
    pairs = []
    for t in since:
        row = t.row
        if row.start_s is not None and row.end_s is not None:
            durations.setdefault(row.state, []).append(row.end_s - row.start_s)
        if row.startup_s is not None and row.first_decision_s is not None:
            pairs.append((row.startup_s, row.first_decision_s))
        tally.add(t.trial_id, row, t.value, now,
                  on_device=not (row.state == "RUNNING" and row.number in queued))
    if not tally.exact:  # a trial since started before a device's frontier
        return None

    counts = dict(tally.states)
    if queued:
        counts["RUNNING"] -= len(queued)
        counts["QUEUED"] = len(queued)
    states = {}
    for state in (*_STATES, *sorted(set(counts) - set(_STATES))):
        n, total, longest = tally.durations.get(state, (0, 0.0, 0.0))
        states[state] = StateStats(
            count=counts.get(state, 0), mean_s=total / n if n else None,
            median_s=_median(partial(db.ordered_window, connection, study_id, tally.watermark,
                                     tally.holes, "duration", state=state),
                             folded.get(state, 0), durations.get(state, [])),
            max_s=longest if n else None)
    finished = sum(counts.get(s, 0) for s in ("COMPLETE", "PRUNED", "FAIL"))

    flags = db.flags_upto(connection, study_id, tally.watermark, tally.holes) + [t.flags for t in since]
    failed = db.failed_upto(connection, study_id, tally.watermark, tally.holes) + [
        t.trial_id for t in since if t.row.state == "FAIL"]
    failed_trials = failures_of(db.fail_attrs(connection, failed))
    failures = failed_trials.listed
    objective_failures = [n for n, reason, _ in failures if reason != "interrupted"]

    startup = None
    if folded_pairs + len(pairs) > 0:
        startup_s, decision_s = (
            _median(partial(db.ordered_window, connection, study_id, tally.watermark, tally.holes,
                            what),
                    folded_pairs, [p[i] for p in pairs])
            for i, what in enumerate(("startup_s", "first_decision_s")))
        if startup_s is not None and decision_s is not None:
            startup = (folded_pairs + len(pairs), startup_s, decision_s)
    window = tally.window
    report = StatusReport(
        study=name, direction=directions[0],
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=counts.get("PRUNED", 0) / finished if finished else None,
        prune_steps=dict(sorted(tally.prune_steps.items())),
        best=_best(connection, tally, directions[0]) if len(directions) == 1 else None,
        directions=directions, best_trials=pareto(connection, study_id, directions),
        per_device=_device_use(tally, listed), running=running,
        fail_reasons=failed_trials.reasons,
        wall_s=None if window is None else window[2] - window[0], queued=queued,
        retried=failed_trials.rerun, never_ran=failed_trials.never_ran,
        # the time with trials running is the union of every device's intervals; the tally
        # keeps one union per device, so it is known only where there is one device
        active_s=tally.devices[0].busy() if window is not None and len(tally.devices) == 1
        else None,
        min_resource_auto=study_attrs.get(keys.PRUNER_MIN_RESOURCE_AUTO),
        pruner_tune=(config.get("pruner") or {}).get("tune") == "auto",
        pruner_history=study_attrs.get(keys.PRUNER_HISTORY) or [],
        pruner_tuning=study_attrs.get(keys.PRUNER_TUNING),
        last_failed=max(objective_failures) if objective_failures else None,
        packing=packing_of(study_attrs), device_choices=device_choices_of(study_attrs))
    report.findings = find_all(report, StudyFacts(
        config=config, rows=[], startup=startup,
        unverified=sorted((f.number, f.opencl_platform) for f in flags
                          if f.gpu_verified is not None and not f.gpu_verified),
        mismatches=sorted((f.number, f.params_mismatch) for f in flags if f.params_mismatch),
        max_complete_step=tally.max_complete_step, failures=failures))
    return report


def _best(connection: Connection, tally: Tally, direction: str) -> dict[str, Any] | None:
    best = tally.best_min if direction == "minimize" else tally.best_max
    return None if best is None else db.best_of(connection, best[2], best[1], best[0])


def _device_use(tally: Tally, listed: dict[str, list[dict[str, Any]]]) -> list[DeviceUse]:
    """As _collect's (labels count the hosts of the trials on devices: queued ones are not);
    the busy time is the union of a device's intervals, all of which lie in
    the study's window; the part of it after the last start (``queued_hi``) is one stretch,
    from there to the device's last end, as no interval starts later."""
    hosts = len({d.host for d in tally.devices if d.host} | set(listed))
    inventory: dict[tuple[str | None, int | None], DeviceUse] = {}
    for key in [*((h, g["index"]) for h, devices in listed.items() for g in devices),
                *((d.host, d.gpu_index) for d in tally.devices)]:
        inventory.setdefault(key, DeviceUse(device_label(key[0], key[1], hosts), key[0], key[1]))
    if tally.window is None:
        return sorted(inventory.values(), key=lambda d: d.device)
    lo, queued_hi, hi = tally.window
    for key, use in inventory.items():
        kept = next((d for d in tally.devices if (d.host, d.gpu_index) == key), None)
        busy = 0.0 if kept is None else kept.busy()
        after = 0.0 if kept is None or kept.max_end is None else max(0.0, kept.max_end - queued_hi)
        if hi > lo:
            use.busy_fraction = busy / (hi - lo)
        if queued_hi > lo:
            use.busy_fraction_queued = (busy - after) / (queued_hi - lo)
        if kept is None:
            continue
        use.trials, use.states = kept.trials, dict(kept.states)
        use.util_mean = round(kept.util[0] / kept.util[1], 1) if kept.util[1] > 0 else None
        use.util_compute_mean = (round(kept.util_compute[0] / kept.util_compute[1], 1)
                                 if kept.util_compute[1] > 0 else None)
        use.energy_kj = round(kept.energy[0] / 1000, 3) if kept.energy[1] else None
    return sorted(inventory.values(), key=lambda d: d.device)
