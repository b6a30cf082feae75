"""Status from plain SQL over Optuna's tables: never loads every trial through the ORM.

Works on sqlite and PostgreSQL (no dialect-specific date functions: durations are computed
from the two timestamps in Python, one narrow row per trial).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from hpo_orchestrator.errors import ConfigError, StorageError

__all__ = ["StateStats", "StatusReport", "collect_status", "list_studies"]

_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


@dataclass
class StateStats:
    count: int = 0
    mean_s: float | None = None
    median_s: float | None = None
    max_s: float | None = None


@dataclass
class StatusReport:
    study: str
    direction: str
    n_trials_target: int | None
    states: dict[str, StateStats]
    prune_rate: float | None
    best: dict[str, Any] | None
    per_gpu: list[dict[str, Any]]
    running: list[dict[str, Any]]
    fail_reasons: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def list_studies(connection: Connection) -> list[str]:
    return [row[0] for row in connection.execute(text("SELECT study_name FROM studies ORDER BY study_id"))]


def _study_id(connection: Connection, study: str | None) -> tuple[int, str]:
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
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _seconds(start: Any, end: Any) -> float | None:
    start, end = _timestamp(start), _timestamp(end)
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def _attr_rows(connection: Connection, study_id: int, key: str) -> dict[int, Any]:
    rows = connection.execute(text(
        "SELECT a.trial_id, a.value_json FROM trial_user_attributes a "
        "JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = :s AND a.key = :k"),
        {"s": study_id, "k": key})
    return {int(trial_id): json.loads(value) for trial_id, value in rows}


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


def _collect(connection: Connection, study: str | None) -> StatusReport:
    study_id, name = _study_id(connection, study)
    direction_row = connection.execute(text(
        "SELECT direction FROM study_directions WHERE study_id = :s ORDER BY objective"),
        {"s": study_id}).first()
    direction = str(direction_row[0]).split(".")[-1].lower() if direction_row else "minimize"

    trials = connection.execute(text(
        "SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials "
        "WHERE study_id = :s"), {"s": study_id}).all()
    durations: dict[str, list[float]] = {s: [] for s in _STATES}
    counts = dict.fromkeys(_STATES, 0)
    running_rows = []
    for trial_id, number, state, start, end in trials:
        state = str(state).split(".")[-1]
        counts[state] = counts.get(state, 0) + 1
        seconds = _seconds(start, end)
        if seconds is not None:
            durations.setdefault(state, []).append(seconds)
        if state == "RUNNING":
            running_rows.append((trial_id, number, start))

    states = {}
    for state, count in counts.items():
        values = durations.get(state, [])
        states[state] = StateStats(
            count=count,
            mean_s=statistics.fmean(values) if values else None,
            median_s=statistics.median(values) if values else None,
            max_s=max(values) if values else None)
    finished = counts["COMPLETE"] + counts["PRUNED"] + counts["FAIL"]
    prune_rate = counts["PRUNED"] / finished if finished else None

    order = "ASC" if direction == "minimize" else "DESC"
    best_row = connection.execute(text(
        "SELECT t.trial_id, t.number, v.value FROM trials t JOIN trial_values v "
        "ON v.trial_id = t.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE' "
        f"AND v.objective = 0 AND v.value IS NOT NULL ORDER BY v.value {order} LIMIT 1"),
        {"s": study_id}).first()
    best = None
    if best_row is not None:
        params = connection.execute(text(
            "SELECT param_name, param_value, distribution_json FROM trial_params "
            "WHERE trial_id = :t"), {"t": best_row[0]}).all()
        best = {"number": best_row[1], "value": best_row[2],
                "params": {p: _param_value(v, d) for p, v, d in params}}

    target = None
    config_row = connection.execute(text(
        "SELECT value_json FROM study_user_attributes WHERE study_id = :s AND key = 'hpo.config'"),
        {"s": study_id}).first()
    if config_row is not None:
        target = json.loads(config_row[0]).get("study", {}).get("n_trials")

    gpu_of = _attr_rows(connection, study_id, "hpo.gpu_index")
    per_gpu: dict[str, dict[str, Any]] = {}
    state_of = {tid: str(st).split(".")[-1] for tid, _n, st, _s, _e in trials}
    for trial_id, gpu in gpu_of.items():
        label = "cpu" if gpu is None else f"gpu{gpu}"
        entry = per_gpu.setdefault(label, {"device": label, "trials": 0, "COMPLETE": 0,
                                           "PRUNED": 0, "FAIL": 0, "RUNNING": 0})
        entry["trials"] += 1
        state = state_of.get(trial_id)
        if state in entry:
            entry[state] += 1

    reasons: dict[str, int] = {}
    for reason in _attr_rows(connection, study_id, "hpo.fail_reason").values():
        reasons[str(reason)] = reasons.get(str(reason), 0) + 1

    running = []
    now = datetime.now()  # Optuna stores naive local timestamps
    for trial_id, number, start in sorted(running_rows, key=lambda r: r[1]):
        step = connection.execute(text(
            "SELECT MAX(step) FROM trial_intermediate_values WHERE trial_id = :t"),
            {"t": trial_id}).scalar()
        gpu = gpu_of.get(trial_id)
        running.append({"number": number, "device": "cpu" if gpu is None else f"gpu{gpu}",
                        "elapsed_s": _seconds(start, now), "last_step": step})

    return StatusReport(study=name, direction=direction, n_trials_target=target, states=states,
                        prune_rate=prune_rate, best=best,
                        per_gpu=sorted(per_gpu.values(), key=lambda e: e["device"]),
                        running=running, fail_reasons=reasons)


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
