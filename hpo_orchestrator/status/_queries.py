"""Status from plain SQL over Optuna's tables: never loads every trial through the ORM.

Works on sqlite and PostgreSQL (no dialect-specific date functions: durations are computed
from the two timestamps in Python, one narrow row per trial). What the queries gather is
turned into findings by :mod:`hpo_orchestrator.status._findings`.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine

from hpo_orchestrator.errors import ConfigError, StorageError
from hpo_orchestrator.status._findings import Finding, find_all

__all__ = ["DeviceUse", "StateStats", "StatusReport", "TrialFacts", "collect_status",
           "list_studies", "study_id_of"]

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


@dataclass
class TrialFacts:
    """What the findings need from one trial (a narrow row, not an Optuna FrozenTrial)."""

    trial_id: int
    number: int
    state: str
    start: datetime | None
    end: datetime | None
    attrs: dict[str, Any]

    @property
    def duration_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return (self.end - self.start).total_seconds()


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


def collect_status(engine: Engine, study: str | None) -> StatusReport:
    try:
        with engine.connect() as connection:
            return _collect(connection, study)
    except ConfigError:
        raise
    except Exception as exc:  # sqlalchemy / driver errors: the storage, not the user's input
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot read the storage: {first}",
                           "is it an Optuna database? (optuna trials --storage URL ...)") from None


def _state(value: Any) -> str:
    return str(value).split(".")[-1]  # 'COMPLETE' on sqlite, TrialState enum text elsewhere


def _study_attrs(connection: Connection, study_id: int) -> dict[str, Any]:
    rows = connection.execute(text(
        "SELECT key, value_json FROM study_user_attributes WHERE study_id = :s "
        "AND (key = 'hpo.config' OR key LIKE 'hpo.devices.%')"), {"s": study_id})
    return {key: json.loads(value) for key, value in rows}


def _trial_attrs(connection: Connection, study_id: int) -> dict[int, dict[str, Any]]:
    rows = connection.execute(text(
        "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a "
        "JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = :s AND a.key IN :keys"
    ).bindparams(bindparam("keys", expanding=True)), {"s": study_id, "keys": list(_ATTR_KEYS)})
    attrs: dict[int, dict[str, Any]] = {}
    for trial_id, key, value in rows:
        attrs.setdefault(int(trial_id), {})[key] = json.loads(value)
    return attrs


def _collect(connection: Connection, study: str | None) -> StatusReport:
    study_id, name = study_id_of(connection, study)
    direction_row = connection.execute(text(
        "SELECT direction FROM study_directions WHERE study_id = :s ORDER BY objective"),
        {"s": study_id}).first()
    direction = str(direction_row[0]).split(".")[-1].lower() if direction_row else "minimize"
    study_attrs = _study_attrs(connection, study_id)
    config = study_attrs.get("hpo.config") or {}
    attrs = _trial_attrs(connection, study_id)
    now = _timestamp(connection.execute(text("SELECT CURRENT_TIMESTAMP")).scalar())
    local_now = datetime.now()  # Optuna stores trial times as naive local time

    trials = [TrialFacts(int(tid), int(number), _state(state), _timestamp(start), _timestamp(end),
                         attrs.get(int(tid), {}))
              for tid, number, state, start, end in connection.execute(text(
                  "SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials "
                  "WHERE study_id = :s"), {"s": study_id})]

    counts = Counter(t.state for t in trials)
    durations: dict[str, list[float]] = {}
    for t in trials:
        if t.duration_s is not None:
            durations.setdefault(t.state, []).append(t.duration_s)
    states = {}
    for state in (*_STATES, *sorted(set(counts) - set(_STATES))):
        values = durations.get(state, [])
        states[state] = StateStats(count=counts.get(state, 0),
                                   mean_s=statistics.fmean(values) if values else None,
                                   median_s=statistics.median(values) if values else None,
                                   max_s=max(values) if values else None)
    finished = counts["COMPLETE"] + counts["PRUNED"] + counts["FAIL"]
    prune_rate = counts["PRUNED"] / finished if finished else None

    prune_steps = Counter(int(step) for _tid, step in connection.execute(text(
        "SELECT iv.trial_id, MAX(iv.step) FROM trial_intermediate_values iv "
        "JOIN trials t ON t.trial_id = iv.trial_id WHERE t.study_id = :s AND t.state = 'PRUNED' "
        "GROUP BY iv.trial_id"), {"s": study_id}) if step is not None)
    max_complete_step = connection.execute(text(
        "SELECT MAX(iv.step) FROM trial_intermediate_values iv JOIN trials t "
        "ON t.trial_id = iv.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE'"),
        {"s": study_id}).scalar()

    starts = [t.start for t in trials if t.start is not None]
    ends = [t.end or local_now for t in trials if t.start is not None]
    wall_s = (max(ends) - min(starts)).total_seconds() if starts else None
    per_device = _device_use(trials, study_attrs, local_now)

    running = _running(connection, [t for t in trials if t.state == "RUNNING"], now, local_now,
                       config, hosts=len({t.attrs.get("hpo.host") for t in trials}))
    reasons = Counter(str(t.attrs["hpo.fail_reason"]) for t in trials if "hpo.fail_reason" in t.attrs)
    report = StatusReport(
        study=name, direction=direction,
        n_trials_target=config.get("study", {}).get("n_trials"),
        states=states, prune_rate=prune_rate, prune_steps=dict(sorted(prune_steps.items())),
        best=_best(connection, study_id, direction), per_device=per_device, running=running,
        fail_reasons=dict(sorted(reasons.items())), wall_s=wall_s)
    report.findings = find_all(report, trials, config,
                               None if max_complete_step is None else int(max_complete_step))
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


def _running(connection: Connection, running: list[TrialFacts], db_now: datetime | None,
             local_now: datetime, config: dict[str, Any], hosts: int) -> list[dict[str, Any]]:
    """Running trials with their last step and heartbeat age (database clock vs database clock)."""
    storage = config.get("storage", {})
    grace = storage.get("grace_period_s") or 3 * (storage.get("heartbeat_interval_s") or 10)
    result = []
    for t in sorted(running, key=lambda r: r.number):
        step = connection.execute(text(
            "SELECT MAX(step) FROM trial_intermediate_values WHERE trial_id = :t"),
            {"t": t.trial_id}).scalar()
        beat = _timestamp(connection.execute(text(
            "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"), {"t": t.trial_id}).scalar())
        age = (db_now - beat).total_seconds() if beat is not None and db_now is not None else None
        result.append({
            "number": t.number,
            "device": _label(t.attrs.get("hpo.host"), t.attrs.get("hpo.gpu_index"), hosts),
            "host": t.attrs.get("hpo.host"),
            "elapsed_s": (local_now - t.start).total_seconds() if t.start else None,
            "last_step": step, "heartbeat_age_s": age, "stale": age is not None and age > grace,
            "grace_s": grace})
    return result


def _label(host: str | None, gpu: int | None, hosts: int) -> str:
    device = "cpu" if gpu is None else f"gpu{gpu}"
    return f"{host}:{device}" if hosts > 1 and host else device


def _union_seconds(intervals: list[tuple[datetime, datetime]], lo: datetime, hi: datetime) -> float:
    """Seconds of [lo, hi] covered by at least one interval."""
    total = 0.0
    cursor = lo
    for start, end in sorted(intervals):
        start, end = max(start, cursor), min(end, hi)
        if end > start:
            total += (end - start).total_seconds()
            cursor = end
    return total


def _device_use(trials: list[TrialFacts], study_attrs: dict[str, Any],
                local_now: datetime) -> list[DeviceUse]:
    # Each orchestrator records its host's GPUs (study attr hpo.devices.<host>), so a GPU that
    # never got a trial still shows up.
    listed = {key.removeprefix("hpo.devices."): devices or [] for key, devices in study_attrs.items()
              if key.startswith("hpo.devices.")}
    hosts = {t.attrs.get("hpo.host") for t in trials if t.attrs.get("hpo.host")} | set(listed)
    DeviceKey = tuple[str | None, int | None]
    inventory: dict[DeviceKey, DeviceUse] = {}
    for host, devices in listed.items():
        for gpu in devices:
            inventory[(host, gpu["index"])] = DeviceUse(_label(host, gpu["index"], len(hosts)),
                                                        host, gpu["index"])
    by_device: dict[DeviceKey, list[TrialFacts]] = {}
    for t in trials:
        if "hpo.gpu_index" in t.attrs:
            by_device.setdefault((t.attrs.get("hpo.host"), t.attrs["hpo.gpu_index"]), []).append(t)
    for (trial_host, index), _members in by_device.items():
        inventory.setdefault((trial_host, index),
                             DeviceUse(_label(trial_host, index, len(hosts)), trial_host, index))

    started = [t for t in trials if t.start is not None]
    if not started:
        return sorted(inventory.values(), key=lambda d: d.device)
    study_lo = min(t.start for t in started if t.start)
    study_hi = max((t.end or local_now) for t in started)
    # Trials were queued from the first start until the last trial started.
    queued_hi = max(t.start for t in started if t.start)
    for device_key, use in inventory.items():
        members = by_device.get(device_key, [])
        use.trials = len(members)
        use.states = dict(Counter(t.state for t in members))
        intervals = [(t.start, t.end or local_now) for t in members if t.start is not None]
        wall = (study_hi - study_lo).total_seconds()
        if wall > 0:
            use.busy_fraction = _union_seconds(intervals, study_lo, study_hi) / wall
        queued = (queued_hi - study_lo).total_seconds()
        if queued > 0:
            use.busy_fraction_queued = _union_seconds(intervals, study_lo, queued_hi) / queued
        use.util_mean = _weighted(members, "hpo.gpu_util_mean")
        use.util_compute_mean = _weighted(members, "hpo.gpu_util_compute_mean")
        energy = [t.attrs["hpo.gpu_energy_j"] for t in members
                  if isinstance(t.attrs.get("hpo.gpu_energy_j"), (int, float))]
        use.energy_kj = round(sum(energy) / 1000, 3) if energy else None
    return sorted(inventory.values(), key=lambda d: d.device)


def _weighted(trials: list[TrialFacts], key: str) -> float | None:
    """Mean of a per-trial metric weighted by each trial's duration."""
    total = weight = 0.0
    for t in trials:
        value = t.attrs.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            w = t.duration_s or 0.0
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
