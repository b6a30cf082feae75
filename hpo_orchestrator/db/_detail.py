"""One trial in full (``logs``, ``status --trial``), the failures' errors (the ``failing_trials``
finding), and which study a command means when the user names none."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hpo_orchestrator.db import _trial_rows
from hpo_orchestrator.db._sql import fetch_all, fetch_one, rows, scalar
from hpo_orchestrator.db._study import state_name, to_datetime

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable

__all__ = ["fail_errors", "latest_study", "trial_detail"]

_TRIAL_SQL = ("SELECT trial_id, state, datetime_start, datetime_complete FROM trials "
              "WHERE study_id = :s AND number = :n")
_TRIAL_VALUE_SQL = "SELECT value FROM trial_values WHERE trial_id = :t ORDER BY objective"
_TRIAL_ATTRS_SQL = "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = :t"
_FAIL_ERRORS_SQL = (
    "SELECT t.number, a.key, a.value_json FROM trials t JOIN trial_user_attributes a "
    "ON a.trial_id = t.trial_id WHERE t.study_id = :s AND t.state = 'FAIL' "
    "AND a.key IN ('hpo.error', 'hpo.fail_reason', 'hpo.retried', 'hpo.pid')")
# The study whose trial was asked last (trial ids grow across the whole database); a study
# without trials counts by its own id.
_LATEST_STUDY_SQL = (
    "SELECT s.study_name FROM studies s LEFT JOIN trials t ON t.study_id = s.study_id "
    "GROUP BY s.study_id, s.study_name ORDER BY COALESCE(MAX(t.trial_id), 0) DESC, "
    "s.study_id DESC")


def trial_detail(connection: Readable, study_id: int, number: int) -> dict[str, Any] | None:
    """state, start, end, value (the first objective's) and values (every objective's), params
    and user attrs of trial ``number``; None if absent."""
    row = fetch_one(connection, _TRIAL_SQL, {"s": study_id, "n": number})
    if row is None:
        return None
    trial_id = row[0]
    params = fetch_all(connection, _trial_rows._PARAMS_SQL, {"t": trial_id})
    values = [v for (v,) in rows(connection, _TRIAL_VALUE_SQL, {"t": trial_id})]
    return {
        "number": number, "state": state_name(row[1]), "start": to_datetime(row[2]),
        "end": to_datetime(row[3]),
        "value": values[0] if values else None,
        "values": values,  # one per objective (several: study.directions)
        "params": {p: _trial_rows._param_value(v, d) for p, v, d in params},
        "attrs": {k: json.loads(v) for k, v in rows(connection, _TRIAL_ATTRS_SQL, {"t": trial_id})},
    }


def fail_errors(connection: Readable, study_id: int) -> dict[int, dict[str, Any]]:
    """number -> the failure attrs (hpo.fail_reason, hpo.error, hpo.retried, hpo.pid) of every
    FAIL trial, retried ones too (status/_collect.failures_of counts them)."""
    found: dict[int, dict[str, Any]] = {}
    for number, key, value in rows(connection, _FAIL_ERRORS_SQL, {"s": study_id}):
        found.setdefault(int(number), {})[key] = json.loads(value)
    return found


def latest_study(connection: Readable) -> str | None:
    """The study that most recently started a trial (or was created last)."""
    return scalar(connection, _LATEST_STUDY_SQL)
