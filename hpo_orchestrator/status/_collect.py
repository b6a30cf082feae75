"""Status from plain SQL over the storage (through :mod:`hpo_orchestrator.db`): never loads
every trial through the ORM, nor one row per summarized trial.

The db package hands back SQL aggregates over ``hpo_trial_summary`` and the few trials without
a summary row (running ones, or ones run by something else); :mod:`._sums` combines the two,
and :mod:`._findings` turns the report into findings.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine

from hpo_orchestrator import db
from hpo_orchestrator.status._findings import find_all
from hpo_orchestrator.status._model import StatusReport, StudyFacts
from hpo_orchestrator.status._sums import (
    device_label,
    device_use,
    listed_devices,
    startup,
    state_stats,
    window,
)

__all__ = ["collect_on", "collect_status"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "QUEUED", "WAITING")


def collect_status(engine: Engine, study: str | None) -> StatusReport:
    with db.read_errors(), engine.connect() as connection:
        return collect_on(connection, study)


def collect_on(connection: Connection, study: str | None) -> StatusReport:
    study_id, name = db.study_id_of(connection, study)
    direction = db.study_direction(connection, study_id)
    study_attrs = db.study_attrs(connection, study_id)
    config = study_attrs.get("hpo.config") or {}
    db_now = db.database_now(connection)
    now = time.time()
    has_summary = db.has_summary_table(connection)

    counts = Counter(db.state_counts(connection, study_id))
    uncovered = db.uncovered_trials(connection, study_id, has_summary)
    extra = [u.row for u in uncovered]
    groups = db.summary_group_sums(connection, study_id, now) if has_summary else []
    hosts = len({g.host for g in groups if g.host} | {r.host for r in extra if r.host}
                | set(listed_devices(study_attrs)))
    running = _running(connection, [u for u in uncovered if u.row.state == "RUNNING"],
                       db_now, now, config, hosts)
    # A trial asked ahead of a free slot (scheduler.prefetch) is RUNNING to Optuna but has no
    # process yet: the orchestrator records its slot (hpo.slot) when a slot takes it. Its
    # heartbeat is kept up meanwhile; a stale one stays with the running (stale_running).
    slotless = {u.row.number for u in uncovered if u.row.state == "RUNNING" and config
                and u.attrs.get("hpo.slot") is None}
    queued = sorted(r["number"] for r in running if r["number"] in slotless and not r["stale"])
    running = [r for r in running if r["number"] not in queued]
    if queued:
        counts["RUNNING"] -= len(queued)
        counts["QUEUED"] = len(queued)

    states = state_stats(connection, study_id, has_summary, counts,
                         [*_STATES, *sorted(set(counts) - set(_STATES))], extra)
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

    reasons: Counter[str] = Counter()
    unverified: list[tuple[int, str | None]] = []
    mismatches: list[tuple[int, dict[str, Any]]] = []
    if has_summary:
        for flags in db.summary_flags(connection, study_id):
            if flags.gpu_verified is not None and not flags.gpu_verified:
                unverified.append((flags.number, flags.opencl_platform))
            if flags.params_mismatch:
                mismatches.append((flags.number, flags.params_mismatch))
            if flags.fail_reason:
                reasons[flags.fail_reason] += 1
    for u in uncovered:
        if u.attrs.get("hpo.gpu_verified") is False:
            unverified.append((u.row.number, u.attrs.get("hpo.opencl_platform")))
        if u.attrs.get("hpo.params_mismatch"):
            mismatches.append((u.row.number, u.attrs["hpo.params_mismatch"]))
        if u.attrs.get("hpo.fail_reason"):
            reasons[str(u.attrs["hpo.fail_reason"])] += 1

    span = window(groups, extra, now)
    failures = db.fail_errors(connection, study_id)
    objective_failures = [n for n, reason, _ in failures if reason != "interrupted"]
    report = StatusReport(
        study=name, direction=direction,
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=prune_rate, prune_steps=dict(sorted(prune_steps.items())),
        best=db.best_trial(connection, study_id, direction),
        per_device=device_use(connection, study_id, groups,
                              [r for r in extra if r.state != "RUNNING" or r.number not in queued],
                              study_attrs, now, span),
        running=running, fail_reasons=dict(sorted(reasons.items())),
        wall_s=None if span is None else span[2] - span[0], queued=queued,
        min_resource_auto=study_attrs.get("hpo.pruner.min_resource_auto"),
        last_failed=max(objective_failures) if objective_failures else None,
        packing=_packing(study_attrs))
    pairs, startup_median, decision_median = startup(connection, study_id, groups, extra)
    report.findings = find_all(report, StudyFacts(
        config=config, startup_pairs=pairs, startup_median_s=startup_median,
        first_decision_median_s=decision_median, unverified=sorted(unverified),
        mismatches=sorted(mismatches),
        max_complete_step=None if max_complete_step is None else int(max_complete_step),
        failures=failures))
    return report


def _running(connection: Connection, running: list[db.UncoveredTrial], db_now: datetime | None,
             now: float, config: dict[str, Any], hosts: int) -> list[dict[str, Any]]:
    """Running trials with their last step and heartbeat age (database clock vs database clock)."""
    storage = config.get("storage", {})
    grace = storage.get("grace_period_s") or 3 * (storage.get("heartbeat_interval_s") or 10)
    result = []
    for trial_id, row, _attrs in sorted(running, key=lambda u: u.row.number):
        beat = db.heartbeat_of(connection, trial_id)
        age = (db_now - beat).total_seconds() if beat is not None and db_now is not None else None
        result.append({
            "number": row.number, "device": device_label(row.host, row.gpu_index, hosts), "host": row.host,
            "elapsed_s": now - row.start_s if row.start_s is not None else None,
            "last_step": row.last_step, "heartbeat_age_s": age,
            "stale": age is not None and age > grace, "grace_s": grace})
    return result


def _packing(study_attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """hpo.packing.<host> of every host, with the host named (scheduler/_packer.py writes it)."""
    return [{"host": key.removeprefix("hpo.packing."), **value}
            for key, value in sorted(study_attrs.items())
            if key.startswith("hpo.packing.") and isinstance(value, dict)]
