"""Status from plain SQL over the storage (through :mod:`hpo_orchestrator.db`): the study's
tally (tally/_tally.py) and the trials since its watermark.

One aggregation: the trials status reads are folded into a tally, the study's kept one
(folded at each trial's end: one row, the trials since it, and a few index reads of
``hpo_trial_summary`` for medians, flags and failures), or, where the study has none status
can trust (no run of this version started it, another version's, a summary row gone, a trial
it cannot place), a fresh one that every trial is folded into here. So the cost grows with the
trials since the last trial's end, and a study without a tally costs one read of every trial,
until a run's start rebuilds it (docs/BENCHMARKS.md "status from a kept tally"); a study plain
Optuna wrote has its finished trials folded from a narrow read instead (status/_plain.py).
The numbers are the database's exactly, sums but for their last bits (tests/tally/test_tally.py
checks both ways against a visit of every trial).

Findings are made from the report and a few pre-filtered facts
(:mod:`hpo_orchestrator.status._findings`).
"""

from __future__ import annotations

import gc
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import db, keys
from hpo_orchestrator.status._findings import IDLE_BUSY_BELOW, find_all
from hpo_orchestrator.status._model import DeviceUse, Finding, StateStats, StatusReport, StudyFacts
from hpo_orchestrator.status._plain import PlainStudy, is_plain
from hpo_orchestrator.tally import (
    VERSION,
    DeviceTally,
    SinceTrial,
    Tally,
    fail_attrs,
    failed_upto,
    flags_upto,
    has_tally_table,
    ordered_window,
    other_studies_busy,
    read_tally,
    trials_since,
    trusted,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hpo_orchestrator.db import Readable as Connection

__all__ = ["collect", "collect_status", "collect_status_sqlite", "device_label", "running_of"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "QUEUED", "WAITING")


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """One row object per trial read and nothing cyclic: the cycle collector would only rescan
    them (20 % of the time on 100k trials), so it is paused while they are built."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc_was_enabled:
            gc.enable()


def collect_status(engine: Engine, study: str | None) -> StatusReport:
    with _cycle_collector_paused(), db.read_errors(), engine.connect() as connection:
        return collect(connection, study)


def collect_status_sqlite(connection: sqlite3.Connection, study: str | None) -> StatusReport:
    """Over a plain sqlite3 connection (db/_sql.py: no SQLAlchemy import), in one read
    transaction, so every statement sees the same snapshot."""
    with _cycle_collector_paused(), db.read_errors():
        connection.execute("BEGIN")
        try:
            return collect(connection, study)
        finally:
            connection.execute("COMMIT")


def collect(connection: Connection, study: str | None) -> StatusReport:
    """The study's report: from its kept tally when status can trust it, else from a fresh
    one (a trial since the kept tally that it cannot place makes it fresh too)."""
    study_id, name = db.study_id_of(connection, study)
    directions = db.study_directions(connection, study_id) or ["minimize"]
    study_attrs = db.study_attrs(connection, study_id)
    unreadable = study_attrs.pop(db.UNREADABLE, [])
    db_now = db.database_now(connection)
    now = time.time()
    has_summary = db.has_summary_table(connection)
    fold = partial(_report, connection, study_id, name, directions, study_attrs, db_now, now,
                   has_summary)
    if not has_summary and is_plain(connection):
        plain = PlainStudy(connection, study_id, name, now)
        report = fold(plain.tally, plain=plain)
    else:
        kept = _kept_tally(connection, study_id, name) if has_summary else None
        report = (fold(kept) if kept is not None else None) or fold(Tally(study_name=name))
    assert report is not None  # a fresh tally places every trial, a plain study's has no device
    return _note_unreadable(report, unreadable)


def _kept_tally(connection: Connection, study_id: int, name: str) -> Tally | None:
    """The study's tally if status can trust it (tally/_tally.py's ``trusted``)."""
    if not has_tally_table(connection):
        return None
    stored = read_tally(connection, study_id)
    if stored is None or stored[0] != VERSION:
        return None
    tally = Tally.from_json(stored[1])
    return tally if trusted(connection, study_id, name, tally) else None


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


def _report(connection: Connection, study_id: int, name: str, directions: list[str],
            study_attrs: dict[str, Any], db_now: datetime | None, now: float, has_summary: bool,
            tally: Tally, plain: PlainStudy | None = None) -> StatusReport | None:
    """The report from ``tally`` plus the trials since it (folded into this in-memory copy,
    running ones up to ``now``); None when a trial since it starts before a device's
    frontier: the tally cannot place it. ``plain``: the tally is this plain Optuna study's
    (status/_plain.py), whose folded trials have no summary rows to read."""
    config = study_attrs.get(keys.CONFIG) or {}
    since = trials_since(connection, study_id, tally.watermark, tally.holes, has_summary)
    listed = listed_devices(study_attrs)
    running, queued = _running_since(connection, tally, since, listed, db_now, now, config)
    # What the tally folded before (its medians and flags are index reads of the summary up
    # to its watermark; a fresh tally has folded nothing; a plain study's has no flags)
    before = _Folded(folded={state: int(n) for state, (n, _, _) in tally.durations.items()},
                     pairs=tally.pairs, stored=tally.folded > 0 and plain is None)
    durations, pairs = _fold_since(tally, since, queued, now)
    if not tally.exact:  # a trial since started before a device's frontier
        return None
    counts = _counts(tally, queued)
    window = plain.ordered if plain is not None \
        else partial(ordered_window, connection, study_id, tally.watermark, tally.holes)
    upto = (study_id, tally.watermark, tally.holes)
    flags = (flags_upto(connection, *upto) if before.stored else []) + [t.flags for t in since]
    failed_trials = failures_of(fail_attrs(connection, (
        failed_upto(connection, *upto) if before.stored else [])
        + [t.trial_id for t in since if t.row.state == "FAIL"]))
    report = _assembled(connection, study_id, name, directions, study_attrs, config, tally,
                        _state_stats(tally, counts, window, before.folded, durations),
                        counts, listed, running, queued, failed_trials)
    report.findings = find_all(report, StudyFacts(
        config=config, startup=_startup(window, before.pairs, pairs),
        unverified=_unverified(flags), mismatches=_mismatches(flags),
        max_complete_step=tally.max_complete_step, failures=failed_trials.listed,
        other_studies_s=_other_studies_on_idle_gpus(connection, study_id, report, tally)
        if has_summary else {}, shared_cores=_per_host(study_attrs, keys.SHARED_CORES_PREFIX)))
    return report


def _running_since(connection: Connection, tally: Tally, since: list[SinceTrial],
                   listed: dict[str, list[dict[str, Any]]], db_now: datetime | None, now: float,
                   config: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """The running trials among those since the tally, and the numbers of those only queued;
    labelled with their host where the study ran on several."""
    hosts = {d.host for d in tally.devices if d.host} | {t.row.host for t in since if t.row.host} \
        | set(listed)
    unfinished = [db.UncoveredTrial(t.trial_id, t.row, t.attrs) for t in since
                  if t.row.state == "RUNNING" and not t.summarized]
    return running_of(connection, unfinished, db_now, now, config, len(hosts))


def _unverified(flags: list[Any]) -> list[tuple[int, Any]]:
    """Trials whose GPU showed no work from them (gpu_unused), with their OpenCL platform."""
    return sorted((f.number, f.opencl_platform) for f in flags
                  if f.gpu_verified is not None and not f.gpu_verified)


def _mismatches(flags: list[Any]) -> list[tuple[int, Any]]:
    """Trials the library ran with other values than suggested (params_differ)."""
    return sorted((f.number, f.params_mismatch) for f in flags if f.params_mismatch)


@dataclass(frozen=True)
class _Folded:
    """What a tally had folded before the trials since it: per state, the trials whose
    durations its summary rows hold; the trials with start-up pairs; whether its trials have
    summary rows to read (flags, failures)."""

    folded: dict[str, int]
    pairs: int
    stored: bool


def _fold_since(tally: Tally, since: list[SinceTrial], queued: list[int],
                now: float) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """Fold the trials since the tally into it (a queued one on no device); their durations
    by state and (start-up, first decision) pairs, for the medians."""
    durations: dict[str, list[float]] = {}
    pairs = []
    for t in since:
        row = t.row
        number, state, _, _, start, end, startup_time, decision_time, _, _, _, _ = row
        if start is not None and end is not None:
            durations.setdefault(state, []).append(end - start)
        if startup_time is not None and decision_time is not None:
            pairs.append((startup_time, decision_time))
        tally.add(t.trial_id, row, t.value, now,
                  on_device=not (state == "RUNNING" and number in queued))
    return durations, pairs


def _counts(tally: Tally, queued: list[int]) -> dict[str, int]:
    """Trials per state, those asked ahead of a slot QUEUED rather than RUNNING."""
    counts = dict(tally.states)
    if queued:
        counts["RUNNING"] -= len(queued)
        counts["QUEUED"] = len(queued)
    return counts


def _state_stats(tally: Tally, counts: dict[str, int], window: Callable[..., list[float]],
                 folded: dict[str, int], durations: dict[str, list[float]]) -> dict[str, StateStats]:
    """Count, mean, median and longest duration per state (the usual ones first)."""
    states = {}
    for state in (*_STATES, *sorted(set(counts) - set(_STATES))):
        n, total, longest = tally.durations.get(state, (0, 0.0, 0.0))
        states[state] = StateStats(
            count=counts.get(state, 0), mean_s=total / n if n else None,
            median_s=_median(partial(window, "duration", state=state), folded.get(state, 0),
                             durations.get(state, [])),
            max_s=longest if n else None)
    return states


def _startup(window: Callable[..., list[float]], folded_pairs: int,
             pairs: list[tuple[float, float]]) -> tuple[int, float, float] | None:
    """(trials, median start-up, median first decision) for slow_startup; None without."""
    if folded_pairs + len(pairs) == 0:
        return None
    startup_s, decision_s = (_median(partial(window, what), folded_pairs, [p[i] for p in pairs])
                             for i, what in enumerate(("startup_s", "first_decision_s")))
    if startup_s is None or decision_s is None:
        return None
    return folded_pairs + len(pairs), startup_s, decision_s


def _assembled(connection: Connection, study_id: int, name: str, directions: list[str],
               study_attrs: dict[str, Any], config: dict[str, Any], tally: Tally,
               states: dict[str, StateStats], counts: dict[str, int],
               listed: dict[str, list[dict[str, Any]]], running: list[dict[str, Any]],
               queued: list[int], failed_trials: Failures) -> StatusReport:
    """The report's fields (its findings come after, from the report itself)."""
    finished = sum(counts.get(s, 0) for s in ("COMPLETE", "PRUNED", "FAIL"))
    objective_failures = [n for n, reason, _ in failed_trials.listed if reason != "interrupted"]
    study_window = tally.window
    return StatusReport(
        study=name, direction=directions[0],
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=counts.get("PRUNED", 0) / finished if finished else None,
        prune_steps=dict(sorted(tally.prune_steps.items())),
        best=_best(connection, tally, directions[0]) if len(directions) == 1 else None,
        directions=directions, best_trials=_pareto(connection, study_id, directions),
        per_device=_device_use(tally, listed), running=running,
        fail_reasons=failed_trials.reasons,
        wall_s=None if study_window is None else study_window[2] - study_window[0], queued=queued,
        retried=failed_trials.rerun, never_ran=failed_trials.never_ran,
        active_s=tally.hosts[0].busy() if study_window is not None and len(tally.hosts) == 1
        else None,
        min_resource_auto=study_attrs.get(keys.PRUNER_MIN_RESOURCE_AUTO),
        pruner_tune=(config.get("pruner") or {}).get("tune") == "auto",
        pruner_history=study_attrs.get(keys.PRUNER_HISTORY) or [],
        pruner_tuning=study_attrs.get(keys.PRUNER_TUNING),
        last_failed=max(objective_failures) if objective_failures else None,
        packing=_per_host(study_attrs, keys.PACKING_PREFIX),
        device_choices=_per_host(study_attrs, keys.DEVICE_CHOICE_PREFIX))


def _other_studies_on_idle_gpus(connection: Connection, study_id: int, report: StatusReport,
                                tally: Tally) -> dict[tuple[str | None, int | None], float]:
    """For each GPU this study left idle while its trials waited, the seconds other studies'
    trials had it in that time (from the study's first start to its host's last start): read
    for those GPUs only, so a study alone on its GPUs reads nothing more."""
    if tally.window is None:
        return {}
    last_start = {h.host: h.max_start for h in tally.hosts if h.max_start is not None}
    return {(use.host, use.gpu_index): other_studies_busy(
                connection, study_id, use.host, use.gpu_index, tally.window[0], last_start[use.host])
            for use in report.per_device
            if use.host in last_start and use.host is not None and use.gpu_index is not None
            and use.busy_fraction_queued is not None and use.busy_fraction_queued < IDLE_BUSY_BELOW}


@dataclass(frozen=True)
class Failures:
    """The study's FAIL trials as status counts them."""

    listed: list[tuple[int, str | None, str | None]]  # (number, reason, error) not run again
    rerun: int  # attempts that ran and whose params run again (interrupted, retried)
    reasons: dict[str, int]  # hpo.fail_reason of the FAIL trials that ran
    never_ran: int = 0  # asked ahead and put back before a slot took them


def failures_of(attrs: dict[int, dict[str, Any]]) -> Failures:
    """From each FAIL trial's failure attrs (number -> hpo.fail_reason, hpo.error, hpo.retried,
    hpo.pid). A trial asked ahead that no slot took (retried, and no ``hpo.pid``: the
    orchestrator writes it when a slot takes the trial) never ran: it is neither a re-run
    attempt nor an interrupted trial, so that the summary agrees with the run's progress,
    which never saw it. Only FAIL trials are read: a reason another client wrote on a COMPLETE
    or PRUNED trial is no failure."""
    listed, rerun, never_ran, reasons = [], 0, 0, Counter[str]()
    for number, found in attrs.items():
        retried = found.get(keys.RETRIED) is True
        if retried and keys.PID not in found:
            never_ran += 1
            continue
        rerun += retried
        if found.get(keys.FAIL_REASON):
            reasons[str(found[keys.FAIL_REASON])] += 1
        if not retried:
            listed.append((number, found.get(keys.FAIL_REASON), found.get(keys.ERROR)))
    return Failures(sorted(listed), rerun, dict(sorted(reasons.items())), never_ran)


def _best(connection: Connection, tally: Tally, direction: str) -> dict[str, Any] | None:
    best = tally.best_min if direction == "minimize" else tally.best_max
    return None if best is None else db.best_of(connection, best[2], best[1], best[0])


def _pareto(connection: Connection, study_id: int, directions: list[str]) -> list[dict[str, Any]]:
    """A multi-objective study's Pareto-optimal trials with their params (none for one objective:
    ``best`` says it)."""
    if len(directions) < 2:
        return []
    return [{"number": t.number, "values": list(t.values),
             "params": db.trial_params(connection, t.trial_id)}
            for t in db.best_trials(connection, study_id)[1]]


def _device_use(tally: Tally, listed: dict[str, list[dict[str, Any]]]) -> list[DeviceUse]:
    """Every device a trial ran on or an orchestrator listed (labels count the hosts of the
    trials on devices: queued ones are not). A device's busy share is the union of its
    intervals over the time the study had a trial running on its host (``tally.hosts``), so
    the gaps between runs are nobody's; the share while trials were still waiting to start is
    the same up to the host's last start."""
    hosts = len({d.host for d in tally.devices if d.host} | set(listed))
    inventory: dict[tuple[str | None, int | None], DeviceUse] = {}
    for key in [*((h, g["index"]) for h, devices in listed.items() for g in devices),
                *((d.host, d.gpu_index) for d in tally.devices)]:
        inventory.setdefault(key, DeviceUse(device_label(key[0], key[1], hosts), key[0], key[1]))
    if tally.window is None:
        return sorted(inventory.values(), key=lambda d: d.device)
    for key, use in inventory.items():
        host = next((h for h in tally.hosts if h.host == key[0]), None)
        if host is not None and host.max_start is not None:  # a trial of the study ran there
            _measure_use(use, host, next((d for d in tally.devices
                                          if (d.host, d.gpu_index) == key), None))
    return sorted(inventory.values(), key=lambda d: d.device)


def _measure_use(use: DeviceUse, host: DeviceTally, kept: DeviceTally | None) -> None:
    """A device's busy shares against its host's active time (and up to the host's last
    start), and what its trials measured; ``kept``: the device's tally, None where no trial
    ran on it."""
    queued_hi = host.max_start
    assert queued_hi is not None  # the caller's: a trial of the study ran on the host
    use.active_s, use.active_queued_s = host.busy(), host.busy_until(queued_hi)
    if use.active_s > 0:
        use.busy_fraction = 0.0 if kept is None else kept.busy() / use.active_s
    if use.active_queued_s > 0:
        use.busy_fraction_queued = 0.0 if kept is None \
            else kept.busy_until(queued_hi) / use.active_queued_s
    if kept is None:
        return
    use.trials, use.states = kept.trials, dict(kept.states)
    use.util_mean = round(kept.util[0] / kept.util[1], 1) if kept.util[1] > 0 else None
    use.util_compute_mean = (round(kept.util_compute[0] / kept.util_compute[1], 1)
                             if kept.util_compute[1] > 0 else None)
    use.energy_kj = round(kept.energy[0] / 1000, 3) if kept.energy[1] else None


def running_of(connection: Connection, trials: list[db.UncoveredTrial], db_now: datetime | None,
               now: float, config: dict[str, Any], hosts: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The running ones among ``trials``, with their last step and heartbeat age (database
    clock vs database clock), and the numbers of those only queued.

    A trial asked ahead of a free slot (scheduler.prefetch) is RUNNING to Optuna but has no
    process yet: the orchestrator records its slot (hpo.slot) when a slot takes it. Its
    heartbeat is kept up meanwhile; a stale one stays with the running (stale_running).
    A trial no orchestrator asked (``optuna ask``: keys.asked_outside) is running on device
    ``outside``, ``"outside": true``: its maker finishes it, no run reaps it.
    """
    storage = config.get("storage", {})
    grace = storage.get("grace_period_s") or 3 * (storage.get("heartbeat_interval_s") or 10)
    running: list[dict[str, Any]] = []
    outside: set[int] = set()  # made by `optuna ask` or another program: no run's to finish
    for trial_id, row, attrs in sorted((u for u in trials if u.row.state == "RUNNING"),
                                       key=lambda u: u.row.number):
        beat = db.heartbeat_of(connection, trial_id)
        age = (db_now - beat).total_seconds() if beat is not None and db_now is not None else None
        if keys.asked_outside(attrs, beat is not None):
            outside.add(row.number)
        running.append(_running_entry(row, attrs, age, grace, now, row.number in outside, hosts))
    slotless = {u.row.number for u in trials if u.row.state == "RUNNING" and config
                and u.attrs.get(keys.SLOT) is None and u.row.number not in outside}
    queued = sorted(r["number"] for r in running if r["number"] in slotless and not r["stale"])
    return [r for r in running if r["number"] not in queued], queued


def _running_entry(row: Any, attrs: dict[str, Any], age: float | None, grace: float, now: float,
                   outside: bool, hosts: int) -> dict[str, Any]:
    """One running trial as status shows it (``outside``: no orchestrator asked it)."""
    return {
        "number": row.number, "host": row.host,
        "device": "outside" if outside else device_label(row.host, row.gpu_index, hosts),
        "elapsed_s": now - row.start_s if row.start_s is not None else None,
        "last_step": row.last_step, "heartbeat_age_s": age,
        "stale": age is not None and age > grace, "grace_s": grace, "outside": outside,
        # a first-wave worker's start-up outlasted the run's wait (hpo.setup_running)
        "setup_running": attrs.get(keys.SETUP_RUNNING) is True}


def device_label(host: str | None, gpu: int | None, hosts: int) -> str:
    """gpu0 / cpu, prefixed with the host when the study ran on several."""
    device = "cpu" if gpu is None else f"gpu{gpu}"
    return f"{host}:{device}" if hosts > 1 and host else device


def listed_devices(study_attrs: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """host -> its GPUs, as each orchestrator recorded them (study attr hpo.devices.<host>), so
    a GPU that never got a trial still shows up."""
    return {key.removeprefix(keys.DEVICES_PREFIX): devices or [] for key, devices in study_attrs.items()
            if key.startswith(keys.DEVICES_PREFIX)}


def _per_host(study_attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """The study attrs ``<prefix><host>`` of every host, each with the host named:
    hpo.packing.<host> (scheduler.trials_per_gpu=auto, placement/_packer.py),
    hpo.device_choice.<host> (objective.device=auto's latest measurement) and
    hpo.shared_cores.<host> (other runs on the host's cores); an entry someone
    else wrote in another shape is left out."""
    return [{"host": key.removeprefix(prefix), **value}
            for key, value in sorted(study_attrs.items())
            if key.startswith(prefix) and isinstance(value, dict)]


def _note_unreadable(report: StatusReport, names: list[str]) -> StatusReport:
    """Study attrs of a shape we never write (keys.well_formed) were left out: say which."""
    if names:
        report.findings.append(Finding(
            "unreadable_attr", "warning",
            f"study attrs of a shape this package never writes were left out: {', '.join(names)}",
            "something else wrote them (optuna study set-user-attr, another program on a shared "
            "database); the rest of the study reads as usual", {"attrs": names}))
    return report
