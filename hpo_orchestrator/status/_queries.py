"""Status from plain SQL over Optuna's tables: never loads every trial through the ORM.

Works on sqlite and PostgreSQL (no dialect-specific date functions: durations are computed
from the two timestamps in Python, one narrow row per trial). What the queries gather is
turned into findings by :mod:`hpo_orchestrator.status._findings`.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, inspect, text
from sqlalchemy.engine import Connection, Engine

from hpo_orchestrator.errors import ConfigError, StorageError
from hpo_orchestrator.status._findings import Finding, find_all

__all__ = ["DeviceUse", "StateStats", "StatusReport", "StudyFacts", "TrialRow", "collect_status",
           "device_label", "list_studies", "read_errors", "study_id_of", "trial_rows"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
# Per-trial attrs the status reads (one query for all of them).
_ATTR_KEYS = ("hpo.host", "hpo.gpu_index", "hpo.startup_s", "hpo.first_decision_s",
              "hpo.gpu_util_mean", "hpo.gpu_util_compute_mean", "hpo.gpu_energy_j",
              "hpo.gpu_verified", "hpo.fail_reason", "hpo.params_mismatch", "hpo.opencl_platform")


@dataclass
class StateStats:
    count: int = 0
    mean_s: float | None = None
    median_s: float | None = None
    max_s: float | None = None


@dataclass
class DeviceUse:
    """One device (a GPU, or a host's CPU slots) over the study."""

    device: str
    host: str | None
    gpu_index: int | None
    trials: int = 0
    states: dict[str, int] = field(default_factory=dict)
    busy_fraction: float | None = None  # share of the study's wall time with >= 1 trial on it
    busy_fraction_queued: float | None = None  # the same, while trials were still waiting to start
    util_mean: float | None = None  # GPU utilization %, trial-time weighted
    util_compute_mean: float | None = None  # ... in the compute phase only
    energy_kj: float | None = None


class TrialRow(NamedTuple):
    """One trial as the status needs it: from hpo_trial_summary, or from Optuna's tables for
    trials that have no summary row (running, or run by something else)."""

    number: int
    state: str
    host: str | None
    gpu_index: int | None
    start_s: float | None  # epoch seconds
    end_s: float | None  # None while running
    startup_s: float | None
    first_decision_s: float | None
    util_mean: float | None
    util_compute_mean: float | None
    energy_j: float | None
    last_step: int | None


@dataclass
class StudyFacts:
    """What the findings need besides the report: a few per-trial facts, pre-filtered in SQL."""

    config: dict[str, Any]
    rows: list[TrialRow]
    max_complete_step: int | None
    unverified: list[tuple[int, str | None]]  # (number, OpenCL platform) with gpu_verified false
    mismatches: list[tuple[int, dict[str, Any]]]  # (number, {param: [suggested, effective]})


@dataclass
class StatusReport:
    study: str
    direction: str
    n_trials_target: int | None
    states: dict[str, StateStats]
    prune_rate: float | None
    prune_steps: dict[int, int]  # step at which trials were pruned -> how many
    best: dict[str, Any] | None
    per_device: list[DeviceUse]
    running: list[dict[str, Any]]
    fail_reasons: dict[str, int] = field(default_factory=dict)
    wall_s: float | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["prune_steps"] = {str(k): v for k, v in self.prune_steps.items()}
        return data


def list_studies(connection: Connection) -> list[str]:
    return [row[0] for row in connection.execute(text("SELECT study_name FROM studies ORDER BY study_id"))]


def study_id_of(connection: Connection, study: str | None) -> tuple[int, str]:
    names = list_studies(connection)
    if study is None:
        if len(names) == 1:
            study = names[0]
        else:
            raise ConfigError("the storage holds several studies" if names else "the storage holds no study",
                              f"pass --study NAME (studies: {', '.join(names) or 'none'})")
    row = connection.execute(text("SELECT study_id FROM studies WHERE study_name = :n"),
                             {"n": study}).first()
    if row is None:
        raise ConfigError(f"no study named {study!r}",
                          f"studies in this storage: {', '.join(names) or 'none'}")
    return int(row[0]), study


def _timestamp(value: Any) -> datetime | None:
    """sqlite hands text() timestamps back as strings, PostgreSQL as datetimes."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=None) if value.tzinfo else value
    return datetime.fromisoformat(str(value))


@contextmanager
def read_errors() -> Iterator[None]:
    """Database errors while reading become one StorageError (the storage, not the user's
    input); the user's own errors (a wrong study name) pass through."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:  # sqlalchemy / driver errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot read the storage: {first}",
                           "is it an Optuna database? (optuna trials --storage URL ...)") from None


def collect_status(engine: Engine, study: str | None) -> StatusReport:
    # One row object per trial and nothing cyclic: the cycle collector would only rescan them
    # (20 % of the time on 100k trials), so it is paused while they are built.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with read_errors(), engine.connect() as connection:
            return _collect(connection, study)
    finally:
        if gc_was_enabled:
            gc.enable()


def trial_rows(connection: Connection, study_id: int) -> list[TrialRow]:
    """Every trial of the study, one narrow row each (summary rows where written, Optuna's
    tables for the rest)."""
    has_summary = inspect(connection).has_table("hpo_trial_summary")
    rows = _summary_rows(connection, study_id) if has_summary else []
    return rows + _uncovered_rows(connection, study_id, has_summary, time.time())[0]


def _state(value: Any) -> str:
    return str(value).split(".")[-1]  # 'COMPLETE' on sqlite, TrialState enum text elsewhere


def _study_attrs(connection: Connection, study_id: int) -> dict[str, Any]:
    rows = connection.execute(text(
        "SELECT key, value_json FROM study_user_attributes WHERE study_id = :s "
        "AND (key = 'hpo.config' OR key LIKE 'hpo.devices.%')"), {"s": study_id})
    return {key: json.loads(value) for key, value in rows}


def _summary_rows(connection: Connection, study_id: int) -> list[TrialRow]:
    """All summary rows of the study, fetched in one go.

    Through the DBAPI cursor, not SQLAlchemy's Row objects: on 100k trials this fetch is the
    largest cost of ``status`` and the raw fetchall is 3x faster. The only parameter is an int
    formatted into the SQL, so the driver's paramstyle does not matter.
    """
    cursor = connection.connection.cursor()
    try:
        cursor.execute(
            "SELECT number, state, host, gpu_index, start_s, end_s, startup_s, first_decision_s, "
            "gpu_util_mean, gpu_util_compute_mean, gpu_energy_j, last_step FROM hpo_trial_summary "
            f"WHERE study_id = {int(study_id)}")
        make = tuple.__new__  # TrialRow._make without its per-row length check
        return [make(TrialRow, row) for row in cursor.fetchall()]
    finally:
        cursor.close()


def _uncovered_rows(connection: Connection, study_id: int, has_summary: bool,
                    now: float) -> tuple[list[TrialRow], list[tuple[int, Any, dict[str, Any]]]]:
    """Trials without a summary row, read from Optuna's tables and their hpo.* attrs.

    Returns the rows and, for the findings, (trial_id, number, attrs) of each.
    """
    missing = " AND NOT EXISTS (SELECT 1 FROM hpo_trial_summary h WHERE h.trial_id = t.trial_id)" \
        if has_summary else ""
    trials = connection.execute(text(
        "SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete, "
        "(SELECT MAX(iv.step) FROM trial_intermediate_values iv WHERE iv.trial_id = t.trial_id) "
        f"FROM trials t WHERE t.study_id = :s{missing}"), {"s": study_id}).all()
    if not trials:
        return [], []
    attrs: dict[int, dict[str, Any]] = {}
    query = ("SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a "
             "JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = :s AND a.key IN :keys")
    params: dict[str, Any] = {"s": study_id, "keys": list(_ATTR_KEYS)}
    if len(trials) <= 500:  # the usual case: a few running or foreign trials
        query += " AND a.trial_id IN :ids"
        params["ids"] = [t[0] for t in trials]
    statement = text(query).bindparams(bindparam("keys", expanding=True))
    if "ids" in params:
        statement = statement.bindparams(bindparam("ids", expanding=True))
    for trial_id, key, value in connection.execute(statement, params):
        attrs.setdefault(int(trial_id), {})[key] = json.loads(value)
    rows, facts = [], []
    for trial_id, number, state, start, end, last_step in trials:
        a = attrs.get(int(trial_id), {})
        begin, finish = _timestamp(start), _timestamp(end)
        rows.append(TrialRow(
            int(number), _state(state), a.get("hpo.host"), a.get("hpo.gpu_index"),
            begin.timestamp() if begin else None, finish.timestamp() if finish else None,
            _number(a.get("hpo.startup_s")), _number(a.get("hpo.first_decision_s")),
            _number(a.get("hpo.gpu_util_mean")), _number(a.get("hpo.gpu_util_compute_mean")),
            _number(a.get("hpo.gpu_energy_j")), None if last_step is None else int(last_step)))
        facts.append((int(trial_id), int(number), a))
    return rows, facts


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _collect(connection: Connection, study: str | None) -> StatusReport:
    study_id, name = study_id_of(connection, study)
    direction_row = connection.execute(text(
        "SELECT direction FROM study_directions WHERE study_id = :s ORDER BY objective"),
        {"s": study_id}).first()
    direction = str(direction_row[0]).split(".")[-1].lower() if direction_row else "minimize"
    study_attrs = _study_attrs(connection, study_id)
    config = study_attrs.get("hpo.config") or {}
    db_now = _timestamp(connection.execute(text("SELECT CURRENT_TIMESTAMP")).scalar())
    now = time.time()
    has_summary = inspect(connection).has_table("hpo_trial_summary")

    counts = Counter({_state(state): int(n) for state, n in connection.execute(text(
        "SELECT state, COUNT(*) FROM trials WHERE study_id = :s GROUP BY state"), {"s": study_id})})
    rows = _summary_rows(connection, study_id) if has_summary else []
    uncovered, uncovered_facts = _uncovered_rows(connection, study_id, has_summary, now)
    rows += uncovered

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
        for step, n in connection.execute(text(
                "SELECT last_step, COUNT(*) FROM hpo_trial_summary WHERE study_id = :s "
                "AND state = 'PRUNED' AND last_step IS NOT NULL GROUP BY last_step"), {"s": study_id}):
            prune_steps[int(step)] += int(n)
        max_complete_step = connection.execute(text(
            "SELECT MAX(last_step) FROM hpo_trial_summary WHERE study_id = :s AND state = 'COMPLETE'"),
            {"s": study_id}).scalar()
    for row in uncovered:
        if row.last_step is not None and row.state == "PRUNED":
            prune_steps[row.last_step] += 1
        if row.last_step is not None and row.state == "COMPLETE":
            max_complete_step = max(max_complete_step or 0, row.last_step)

    reasons: Counter[str] = Counter()
    unverified: list[tuple[int, str | None]] = []
    mismatches: list[tuple[int, dict[str, Any]]] = []
    if has_summary:
        for number, verified, platform, mismatch, reason in connection.execute(text(
                "SELECT number, gpu_verified, opencl_platform, params_mismatch, fail_reason "
                "FROM hpo_trial_summary WHERE study_id = :s AND (gpu_verified = false "
                "OR params_mismatch IS NOT NULL OR fail_reason IS NOT NULL)"), {"s": study_id}):
            if verified is not None and not verified:
                unverified.append((int(number), platform))
            if mismatch:
                mismatches.append((int(number), json.loads(mismatch)))
            if reason:
                reasons[str(reason)] += 1
    for _tid, number, a in uncovered_facts:
        if a.get("hpo.gpu_verified") is False:
            unverified.append((number, a.get("hpo.opencl_platform")))
        if a.get("hpo.params_mismatch"):
            mismatches.append((number, a["hpo.params_mismatch"]))
        if a.get("hpo.fail_reason"):
            reasons[str(a["hpo.fail_reason"])] += 1

    window = _window(rows, now)
    hosts = len(_hosts(rows, _listed_devices(study_attrs)))
    trial_id_of = {number: tid for tid, number, _a in uncovered_facts}
    running = _running(connection, [r for r in uncovered if r.state == "RUNNING"], trial_id_of,
                       db_now, now, config, hosts)
    report = StatusReport(
        study=name, direction=direction,
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=prune_rate, prune_steps=dict(sorted(prune_steps.items())),
        best=_best(connection, study_id, direction),
        per_device=_device_use(rows, study_attrs, now, window),
        running=running, fail_reasons=dict(sorted(reasons.items())),
        wall_s=None if window is None else window[2] - window[0])
    report.findings = find_all(report, StudyFacts(
        config=config, rows=rows, unverified=sorted(unverified), mismatches=sorted(mismatches),
        max_complete_step=None if max_complete_step is None else int(max_complete_step)))
    return report


def _best(connection: Connection, study_id: int, direction: str) -> dict[str, Any] | None:
    order = "ASC" if direction == "minimize" else "DESC"
    row = connection.execute(text(
        "SELECT t.trial_id, t.number, v.value FROM trials t JOIN trial_values v "
        "ON v.trial_id = t.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE' "
        f"AND v.objective = 0 AND v.value IS NOT NULL ORDER BY v.value {order} LIMIT 1"),
        {"s": study_id}).first()
    if row is None:
        return None
    params = connection.execute(text(
        "SELECT param_name, param_value, distribution_json FROM trial_params "
        "WHERE trial_id = :t"), {"t": row[0]}).all()
    return {"number": row[1], "value": row[2],
            "params": {p: _param_value(v, d) for p, v, d in params}}


def _running(connection: Connection, running: list[TrialRow], trial_id_of: dict[int, int],
             db_now: datetime | None, now: float, config: dict[str, Any],
             hosts: int) -> list[dict[str, Any]]:
    """Running trials with their last step and heartbeat age (database clock vs database clock)."""
    storage = config.get("storage", {})
    grace = storage.get("grace_period_s") or 3 * (storage.get("heartbeat_interval_s") or 10)
    result = []
    for row in sorted(running, key=lambda r: r.number):
        beat = _timestamp(connection.execute(text(
            "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"),
            {"t": trial_id_of.get(row.number)}).scalar())
        age = (db_now - beat).total_seconds() if beat is not None and db_now is not None else None
        result.append({
            "number": row.number, "device": device_label(row.host, row.gpu_index, hosts), "host": row.host,
            "elapsed_s": now - row.start_s if row.start_s is not None else None,
            "last_step": row.last_step, "heartbeat_age_s": age,
            "stale": age is not None and age > grace, "grace_s": grace})
    return result


def device_label(host: str | None, gpu: int | None, hosts: int) -> str:
    """gpu0 / cpu, prefixed with the host when the study ran on several."""
    device = "cpu" if gpu is None else f"gpu{gpu}"
    return f"{host}:{device}" if hosts > 1 and host else device


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


def _listed_devices(study_attrs: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """host -> its GPUs, as each orchestrator recorded them (study attr hpo.devices.<host>), so
    a GPU that never got a trial still shows up."""
    return {key.removeprefix("hpo.devices."): devices or [] for key, devices in study_attrs.items()
            if key.startswith("hpo.devices.")}


def _hosts(rows: list[TrialRow], listed: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {r.host for r in rows if r.host} | set(listed)


def _window(rows: list[TrialRow], now: float) -> tuple[float, float, float] | None:
    """(first start, last start, last end or now): the study's wall time, and the part of it
    in which trials were still waiting to start."""
    starts = [r.start_s for r in rows if r.start_s is not None]
    if not starts:
        return None
    return min(starts), max(starts), max(r.end_s or now for r in rows if r.start_s is not None)


def _device_use(rows: list[TrialRow], study_attrs: dict[str, Any], now: float,
                window: tuple[float, float, float] | None) -> list[DeviceUse]:
    listed = _listed_devices(study_attrs)
    hosts = _hosts(rows, listed)
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
        energy = [r.energy_j for r in members if r.energy_j is not None]
        use.energy_kj = round(sum(energy) / 1000, 3) if energy else None
    return sorted(inventory.values(), key=lambda d: d.device)


def _weighted(rows: list[TrialRow], now: float, compute: bool) -> float | None:
    """Mean GPU utilization over trials, weighted by each trial's duration."""
    total = weight = 0.0
    for row in rows:
        value = row.util_compute_mean if compute else row.util_mean
        if value is not None and row.start_s is not None:
            w = (row.end_s or now) - row.start_s
            total += value * w
            weight += w
    return round(total / weight, 1) if weight > 0 else None


def _param_value(internal: float, distribution_json: str) -> Any:
    """Optuna stores categorical params as the choice's index; give the user the choice."""
    try:
        distribution = json.loads(distribution_json)
    except ValueError:
        return internal
    if distribution.get("name") == "CategoricalDistribution":
        choices = distribution.get("attributes", {}).get("choices", [])
        index = int(internal)
        return choices[index] if 0 <= index < len(choices) else internal
    if distribution.get("name") == "IntDistribution":
        return int(internal)
    return internal
