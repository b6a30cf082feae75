"""Trial reads for status and report: one narrow row per trial, never the ORM.

A trial the orchestrator told has a row in ``hpo_trial_summary`` (db/tables.py); the rest
(running, or run by something else) are read from Optuna's tables and their ``hpo.*`` attrs.
Works on sqlite and PostgreSQL: no dialect-specific date functions, durations are computed
from the two timestamps in Python.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from hpo_orchestrator import keys
from hpo_orchestrator.db._sql import fetch_all, fetch_one, has_table, rows, scalar
from hpo_orchestrator.db._study import state_name, to_datetime, to_epoch
from hpo_orchestrator.db._summary import FLAGGED_WHERE, SUMMARY_ATTRS, SUMMARY_COLUMNS, copied_attrs

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable

__all__ = ["ATTR_KEYS", "SummaryFlags", "TrialRow", "UncoveredTrial", "best_of", "best_trial",
           "from_attrs", "has_summary_table",
           "heartbeat_of", "state_counts", "summary_flags", "summary_max_complete_step",
           "summary_prune_steps", "summary_rows", "trial_rows", "trial_values", "uncovered_trials"]


class TrialRow(NamedTuple):
    """One trial as status and report need it: from hpo_trial_summary, or from Optuna's tables
    for trials that have no summary row (running, or run by something else)."""

    number: int
    state: str
    host: str | None
    gpu_index: int | None
    start_s: float | None  # epoch seconds
    end_s: float | None  # None while running
    startup_s: float | None
    first_decision_s: float | None
    gpu_util_mean: float | None
    gpu_util_compute_mean: float | None
    gpu_energy_j: float | None
    last_step: int | None


class UncoveredTrial(NamedTuple):
    """A trial without a summary row: its row, and its ``hpo.*`` attrs for the findings."""

    trial_id: int
    row: TrialRow
    attrs: dict[str, Any]


class SummaryFlags(NamedTuple):
    """A summarized trial with something to report (GPU unused, params differ, a failure)."""

    number: int
    gpu_verified: bool | None
    opencl_platform: str | None
    params_mismatch: dict[str, Any] | None
    fail_reason: str | None

    @classmethod
    def read(cls, values: Sequence[Any]) -> SummaryFlags:
        """From its fields' summary columns as a driver returns them (a JSON mismatch, sqlite's
        0/1 for a boolean)."""
        number, verified, platform, mismatch, reason = values
        return cls(int(number), None if verified is None else bool(verified), platform,
                   json.loads(mismatch) if mismatch else None, reason or None)


def from_attrs(number: int, state: str, start: Any, end: Any, last_step: int | None,
               attrs: dict[str, Any]) -> tuple[TrialRow, SummaryFlags]:
    """A trial without a summary row (running, or ended outside the orchestrator), from
    Optuna's columns as the driver returns them and its ``hpo.*`` attrs, as its summary row
    would hold them (db/_summary.py). Built without the NamedTuples' per-row checks: status on
    a study without summary rows reads every trial here."""
    start_s, end_s = to_epoch(start), to_epoch(end)
    last_step = None if last_step is None else int(last_step)
    if not attrs:  # Optuna's own trials: nothing to copy
        return (_make(TrialRow, (number, state, None, None, start_s, end_s, None, None, None,
                                 None, None, last_step)),
                _make(SummaryFlags, (number, None, None, None, None)))
    c = copied_attrs(attrs)
    return (_make(TrialRow, (number, state, c["host"], c["gpu_index"], start_s, end_s,
                             c["startup_s"], c["first_decision_s"], c["gpu_util_mean"],
                             c["gpu_util_compute_mean"], c["gpu_energy_j"], last_step)),
            _make(SummaryFlags, (number, c["gpu_verified"], c["opencl_platform"],
                                 json.loads(c["params_mismatch"]) if c["params_mismatch"] else None,
                                 c["fail_reason"])))


_make = tuple.__new__  # a NamedTuple's _make without its length check


def _columns(names: tuple[str, ...], prefix: str = "") -> str:
    assert set(names) <= set(SUMMARY_COLUMNS), names  # TrialRow, SummaryFlags: summary columns
    return ", ".join(prefix + name for name in names)


# Per-trial attrs read for trials without a summary row (one query for all of them): those the
# summary copies, the slot (status's running trials), and what tells a trial an orchestrator
# asked from one made outside the runs (keys.asked_outside) and a setup still running.
ATTR_KEYS = (*SUMMARY_ATTRS, keys.SLOT, keys.PID, keys.ORCHESTRATOR_PID, keys.RETRY_OF,
             keys.SETUP_RUNNING)
# Below this many uncovered trials their attrs are fetched by id (the usual case: a few running
# or foreign trials); above it, for the whole study.
_ATTRS_BY_ID_UP_TO = 500

_SUMMARY_ROWS_SQL = (
    f"SELECT {_columns(TrialRow._fields)} FROM hpo_trial_summary "
    "WHERE study_id = {study_id:d} AND number >= {first:d}")
_UNCOVERED_SQL = (
    "SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete, "
    "(SELECT MAX(iv.step) FROM trial_intermediate_values iv WHERE iv.trial_id = t.trial_id) "
    "FROM trials t WHERE t.study_id = :s AND t.number >= :first")
_NOT_SUMMARIZED_SQL = " AND NOT EXISTS (SELECT 1 FROM hpo_trial_summary h WHERE h.trial_id = t.trial_id)"
_ATTRS_SQL = ("SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a "
              "JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = :s AND t.number >= :first "
              "AND a.key IN :keys")
_ATTRS_BY_ID_SQL = " AND a.trial_id IN :ids"
_STATE_COUNTS_SQL = "SELECT state, COUNT(*) FROM trials WHERE study_id = :s GROUP BY state"
_PRUNE_STEPS_SQL = (
    "SELECT last_step, COUNT(*) FROM hpo_trial_summary WHERE study_id = :s "
    "AND state = 'PRUNED' AND last_step IS NOT NULL GROUP BY last_step")
_MAX_COMPLETE_STEP_SQL = (
    "SELECT MAX(last_step) FROM hpo_trial_summary WHERE study_id = :s AND state = 'COMPLETE'")
_FLAGS_SQL = (f"SELECT {_columns(SummaryFlags._fields)} FROM hpo_trial_summary "
              f"WHERE study_id = :s AND ({FLAGGED_WHERE})")
_BEST_SQL = (
    "SELECT t.trial_id, t.number, v.value FROM trials t JOIN trial_values v "
    "ON v.trial_id = t.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE' "
    "AND v.objective = 0 AND v.value IS NOT NULL ORDER BY v.value {order}, t.number LIMIT 1")
_PARAMS_SQL = "SELECT param_name, param_value, distribution_json FROM trial_params WHERE trial_id = :t"
_HEARTBEAT_SQL = "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"
_VALUES_SQL = (
    "SELECT t.number, v.value FROM trials t JOIN trial_values v ON v.trial_id = t.trial_id "
    "WHERE t.study_id = :s AND t.number >= :first AND v.objective = 0 AND v.value IS NOT NULL")


def has_summary_table(connection: Readable) -> bool:
    """False on a database no orchestrator of ours has run against (or an older one)."""
    return has_table(connection, "hpo_trial_summary")


def trial_rows(connection: Readable, study_id: int, first: int = 0) -> list[TrialRow]:
    """Every trial of the study from number ``first`` on, one narrow row each."""
    has_summary = has_summary_table(connection)
    rows = summary_rows(connection, study_id, first) if has_summary else []
    return rows + [u.row for u in uncovered_trials(connection, study_id, has_summary, first)]


def summary_rows(connection: Readable, study_id: int, first: int = 0) -> list[TrialRow]:
    """All summary rows of the study from trial number ``first`` on, fetched in one go.

    Through the DBAPI cursor, not SQLAlchemy's Row objects: on 100k trials this fetch is the
    largest cost of ``status`` and the raw fetchall is 3x faster. The only parameter is an int
    formatted into the SQL, so the driver's paramstyle does not matter.
    """
    cursor = (connection if isinstance(connection, sqlite3.Connection)
              else connection.connection).cursor()
    try:
        cursor.execute(_SUMMARY_ROWS_SQL.format(study_id=int(study_id), first=int(first)))
        make = tuple.__new__  # TrialRow._make without its per-row length check
        return [make(TrialRow, row) for row in cursor.fetchall()]
    finally:
        cursor.close()


def uncovered_trials(connection: Readable, study_id: int, has_summary: bool,
                     first: int = 0) -> list[UncoveredTrial]:
    """Trials without a summary row (all of them without the table), from Optuna's tables,
    from trial number ``first`` on."""
    trials = fetch_all(connection, _UNCOVERED_SQL + (_NOT_SUMMARIZED_SQL if has_summary else ""),
                       {"s": study_id, "first": first})
    if not trials:
        return []
    attrs: dict[int, dict[str, Any]] = {}
    query = _ATTRS_SQL
    params: dict[str, Any] = {"s": study_id, "first": first, "keys": list(ATTR_KEYS)}
    expanding = ["keys"]
    if len(trials) <= _ATTRS_BY_ID_UP_TO:
        query += _ATTRS_BY_ID_SQL
        params["ids"] = [t[0] for t in trials]
        expanding.append("ids")
    for trial_id, key, value in rows(connection, query, params, expanding):
        attrs.setdefault(int(trial_id), {})[key] = json.loads(value)
    found = []
    for trial_id, number, state, start, end, last_step in trials:
        a = attrs.get(int(trial_id), {})
        row, _ = from_attrs(int(number), state_name(state), start, end, last_step, a)
        found.append(UncoveredTrial(int(trial_id), row, a))
    return found


def state_counts(connection: Readable, study_id: int) -> dict[str, int]:
    """Trials per state (the contract's first query, docs/DESIGN.md §2.6)."""
    return {state_name(state): int(n)
            for state, n in rows(connection, _STATE_COUNTS_SQL, {"s": study_id})}


def summary_prune_steps(connection: Readable, study_id: int) -> dict[int, int]:
    """Summarized PRUNED trials: step at which they were pruned -> how many."""
    return {int(step): int(n)
            for step, n in rows(connection, _PRUNE_STEPS_SQL, {"s": study_id})}


def summary_max_complete_step(connection: Readable, study_id: int) -> int | None:
    """The last step a summarized COMPLETE trial reported."""
    step = scalar(connection, _MAX_COMPLETE_STEP_SQL, {"s": study_id})
    return None if step is None else int(step)


def summary_flags(connection: Readable, study_id: int) -> list[SummaryFlags]:
    """Summarized trials whose GPU showed no work, whose params differ, or that failed."""
    return [SummaryFlags.read(r) for r in rows(connection, _FLAGS_SQL, {"s": study_id})]


def best_trial(connection: Readable, study_id: int, direction: str) -> dict[str, Any] | None:
    """The best COMPLETE trial (the lowest number among equals): number, value and params
    (categoricals as their choice)."""
    order = "ASC" if direction == "minimize" else "DESC"
    row = fetch_one(connection, _BEST_SQL.format(order=order), {"s": study_id})
    if row is None:
        return None
    return best_of(connection, row[0], row[1], row[2])


def best_of(connection: Readable, trial_id: int, number: int, value: float) -> dict[str, Any]:
    """A trial as ``best`` shows it: number, value and params."""
    params = fetch_all(connection, _PARAMS_SQL, {"t": trial_id})
    return {"number": number, "value": value,
            "params": {p: _param_value(v, d) for p, v, d in params}}


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


def heartbeat_of(connection: Readable, trial_id: int | None) -> datetime | None:
    """The trial's last heartbeat (database clock), None if it never beat."""
    return to_datetime(scalar(connection, _HEARTBEAT_SQL, {"t": trial_id}))


def trial_values(connection: Readable, study_id: int, first: int = 0) -> dict[int, float]:
    """trial number -> objective value, for the trials from number ``first`` on that have one."""
    return {int(number): float(value)
            for number, value in rows(connection, _VALUES_SQL, {"s": study_id, "first": first})}
