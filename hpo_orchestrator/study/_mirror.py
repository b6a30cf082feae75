"""The trials of one study as the run loop's samplers and pruners see them (the data
structure behind study/_storage.py's MirrorStorage), and the bulk reads that fill it: one
statement per table, never the ORM.

Optuna's own cache loads a trial through the ORM's relationships (1.7 ms a trial: 170 s for
100,000); the reads below build the same ``FrozenTrial`` from five flat result sets. Values
are decoded with Optuna's own helpers, so infinities and NaN read back as Optuna wrote them.

Which trials: those with ``trial_id > after`` plus the ones named in ``ids`` (trials the mirror
holds unfinished, or the best ones outside its window). Optuna creates a study's trials under
a lock on the study's row (sqlite: the database's write lock), so trial ids become visible in
increasing order and "the ids above the highest one seen" misses none.
"""

from __future__ import annotations

import bisect
import copy
import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.storages._rdb.models import TrialIntermediateValueModel, TrialValueModel
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db import state_name, to_datetime

__all__ = ["StudyMirror", "best_trial_ids", "by_number", "callers_copy", "new_running_trial",
           "read_trials", "recent_trial_ids", "unfinished_trial_ids_before"]

# Two index-friendly arms instead of one OR (which makes sqlite scan every trial of the
# study): ids above ``after`` by a range on the primary key (``+`` keeps sqlite off the
# study_id index), and the few listed ids. Every parameter is an int formatted into the SQL,
# so the raw DBAPI cursor can run it (3x faster to fetch than SQLAlchemy rows).
_WHERE = ("{col} > {after:d} AND +t.study_id = {s:d} UNION ALL {select} WHERE "
          "{col} IN ({ids}) AND {col} <= {after:d} AND +t.study_id = {s:d}")
_TRIALS = ("SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete "
           "FROM trials t", "t.trial_id")
_PARAMS = ("SELECT p.trial_id, p.param_name, p.param_value, p.distribution_json, p.param_id "
           "FROM trial_params p JOIN trials t ON t.trial_id = p.trial_id", "p.trial_id")
_VALUES = ("SELECT v.trial_id, v.objective, v.value, v.value_type FROM trial_values v "
           "JOIN trials t ON t.trial_id = v.trial_id", "v.trial_id")
_STEPS = ("SELECT i.trial_id, i.step, i.intermediate_value, i.intermediate_value_type "
          "FROM trial_intermediate_values i JOIN trials t ON t.trial_id = i.trial_id", "i.trial_id")
_USER_ATTRS = ("SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a "
               "JOIN trials t ON t.trial_id = a.trial_id", "a.trial_id")
_SYSTEM_ATTRS = ("SELECT a.trial_id, a.key, a.value_json FROM trial_system_attributes a "
                 "JOIN trials t ON t.trial_id = a.trial_id", "a.trial_id")
# The statements as they run (tests/db/test_db_contract.py runs every _..._SQL constant).
_TRIALS_SQL, _PARAMS_SQL, _VALUES_SQL, _STEPS_SQL, _USER_ATTRS_SQL, _SYSTEM_ATTRS_SQL = (
    f"{select} WHERE " + _WHERE.format(col=col, select=select, after=0, s=1, ids="-1")
    for select, col in (_TRIALS, _PARAMS, _VALUES, _STEPS, _USER_ATTRS, _SYSTEM_ATTRS))
_RECENT_IDS_SQL = ("SELECT trial_id FROM trials WHERE study_id = :s "
                   "ORDER BY trial_id DESC LIMIT :n")
_BEST_IDS_SQL = (
    "SELECT t.trial_id FROM trials t JOIN trial_values v ON v.trial_id = t.trial_id "
    "WHERE t.study_id = :s AND t.state = 'COMPLETE' AND v.objective = 0 "
    "AND v.value_type = 'FINITE' ORDER BY v.value {order} LIMIT :n")
_UNFINISHED_BEFORE_SQL = ("SELECT trial_id FROM trials WHERE study_id = :s "
                          "AND state IN ('RUNNING', 'WAITING') AND trial_id < :before")


def _rows(connection: Connection, query: tuple[str, str], study_id: int, after: int,
          ids: list[int]) -> list[tuple[Any, ...]]:
    select, col = query
    sql = f"{select} WHERE " + _WHERE.format(col=col, select=select, after=int(after),
                                             s=int(study_id), ids=",".join(map(str, ids)) or "-1")
    cursor = connection.connection.cursor()
    try:
        cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def read_trials(connection: Connection, study_id: int, after: int,
                ids: Collection[int] = ()) -> list[FrozenTrial]:
    """The study's trials with ``trial_id > after`` or in ``ids``, as Optuna's FrozenTrial,
    in trial-number order (six statements; call it within one transaction for a consistent
    snapshot on PostgreSQL)."""
    listed = sorted(int(i) for i in ids)
    rows = _rows(connection, _TRIALS, study_id, after, listed)
    if not rows:
        return []
    params: dict[int, dict[str, Any]] = {}
    dists: dict[int, dict[str, Any]] = {}
    cache: dict[str, Any] = {}  # distribution JSON is the same text for most trials
    # Optuna lists a trial's params in the order they were set (param_id).
    for tid, name, value, dist_json, _ in sorted(
            _rows(connection, _PARAMS, study_id, after, listed), key=lambda r: r[4]):
        dist = cache.get(dist_json)
        if dist is None:
            dist = cache[dist_json] = json_to_distribution(dist_json)
        params.setdefault(tid, {})[name] = dist.to_external_repr(value)
        dists.setdefault(tid, {})[name] = dist
    values: dict[int, dict[int, float]] = {}
    for tid, objective, value, kind in _rows(connection, _VALUES, study_id, after, listed):
        values.setdefault(tid, {})[objective] = TrialValueModel.stored_repr_to_value(
            value, TrialValueModel.TrialValueType[state_name(kind)])
    steps: dict[int, dict[int, float]] = {}
    for tid, step, value, kind in _rows(connection, _STEPS, study_id, after, listed):
        kind = state_name(kind)
        steps.setdefault(tid, {})[step] = value if kind == "FINITE" else \
            TrialIntermediateValueModel.stored_repr_to_intermediate_value(
                value, TrialIntermediateValueModel.TrialIntermediateValueType[kind])
    user: dict[int, dict[str, Any]] = {}
    for tid, key, value_json in _rows(connection, _USER_ATTRS, study_id, after, listed):
        user.setdefault(tid, {})[key] = json.loads(value_json)
    system: dict[int, dict[str, Any]] = {}
    for tid, key, value_json in _rows(connection, _SYSTEM_ATTRS, study_id, after, listed):
        system.setdefault(tid, {})[key] = json.loads(value_json)
    trials = []
    for tid, number, state, start, complete in rows:
        by_objective = values.get(tid)
        trials.append(FrozenTrial(
            number=number, state=TrialState[state_name(state)], value=None,
            values=[by_objective[k] for k in sorted(by_objective)] if by_objective else None,
            datetime_start=to_datetime(start), datetime_complete=to_datetime(complete),
            params=params.get(tid, {}), distributions=dists.get(tid, {}),
            user_attrs=user.get(tid, {}), system_attrs=system.get(tid, {}),
            intermediate_values=steps.get(tid, {}), trial_id=tid))
    trials.sort(key=lambda t: t.number)
    return trials


def recent_trial_ids(connection: Connection, study_id: int, n: int) -> list[int]:
    """The ids of the study's ``n`` newest trials (by the primary key: no scan)."""
    return [int(r[0]) for r in connection.execute(text(_RECENT_IDS_SQL), {"s": study_id, "n": n})]


def best_trial_ids(connection: Connection, study_id: int, n: int, maximize: bool) -> list[int]:
    """The ids of the ``n`` best COMPLETE trials (first objective, finite values)."""
    sql = _BEST_IDS_SQL.format(order="DESC" if maximize else "ASC")
    return [int(r[0]) for r in connection.execute(text(sql), {"s": study_id, "n": n})]


def unfinished_trial_ids_before(connection: Connection, study_id: int, before: int) -> list[int]:
    """RUNNING and WAITING trials older than ``before`` (outside the mirror's window, but a
    sampler may still care: e.g. a retry waiting to be asked)."""
    rows = connection.execute(text(_UNFINISHED_BEFORE_SQL), {"s": study_id, "before": before})
    return [int(r[0]) for r in rows]


def by_number(trial: FrozenTrial) -> int:
    return trial.number


def new_running_trial(trial_id: int, number: int, started: datetime,
                      user_attrs: dict[str, Any] | None = None) -> FrozenTrial:
    """A trial just asked, as Optuna's storage hands it back from create_new_trial."""
    return FrozenTrial(number=number, state=TrialState.RUNNING, value=None, values=None,
                       datetime_start=started, datetime_complete=None, params={},
                       distributions={}, user_attrs=dict(user_attrs or {}), system_attrs={},
                       intermediate_values={}, trial_id=trial_id)


def callers_copy(trial: FrozenTrial) -> FrozenTrial:
    """A copy to change as optuna.Trial changes the trial it caches (it sets keys of its
    params, distributions, attrs and intermediate values): those dicts copied, their values
    shared (the mirror replaces a value, never changes one in place). copy.deepcopy cost
    0.15-0.5 ms a call, three calls a trial."""
    copied = copy.copy(trial)
    copied._params, copied._distributions = dict(trial._params), dict(trial._distributions)
    copied._user_attrs, copied._system_attrs = dict(trial._user_attrs), dict(trial._system_attrs)
    copied.intermediate_values = dict(trial.intermediate_values)
    return copied


class StudyMirror:
    """The trials of one study that the sampler sees, ordered by number."""

    def __init__(self, maximize: bool, max_history: int | None, keep_best: int) -> None:
        self.maximize = maximize
        self.max_history = max_history
        self.keep_best = keep_best
        self.by_id: dict[int, FrozenTrial] = {}
        self.ordered: list[FrozenTrial] = []
        self.unfinished: set[int] = set()
        self.best: list[FrozenTrial] = []  # the keep_best best COMPLETE trials
        # The highest trial id read from the database: every lower one has been read (or
        # was outside the window). Trials this process creates do not move it, since another
        # process's trial may have a lower id yet be unread.
        self.max_id = -1
        self.refreshed_at = -float("inf")
        self.distributions: dict[str, BaseDistribution] = {}
        # The history is read on the first read that needs it (a sampler's or pruner's), not
        # at start: asking a random trial needs only the WAITING ones.
        self.history_loaded = False

    def put(self, trial: FrozenTrial) -> None:
        old = self.by_id.get(trial._trial_id)
        self.by_id[trial._trial_id] = trial
        if old is not None:
            index = bisect.bisect_left(self.ordered, trial.number, key=by_number)
            self.ordered[index] = trial
        elif not self.ordered or self.ordered[-1].number < trial.number:
            self.ordered.append(trial)  # the usual case: a newer trial
        else:
            bisect.insort(self.ordered, trial, key=by_number)
        if trial.state.is_finished():
            self.unfinished.discard(trial._trial_id)
            if trial.state == TrialState.COMPLETE and trial.values:
                self._consider_best(trial)
        else:
            self.unfinished.add(trial._trial_id)
        for name, dist in trial.distributions.items():
            self.distributions.setdefault(name, dist)

    def _consider_best(self, trial: FrozenTrial) -> None:
        if self.keep_best <= 0:
            return
        sign = -1.0 if self.maximize else 1.0
        self.best = [t for t in self.best if t._trial_id != trial._trial_id]
        bisect.insort(self.best, trial, key=lambda t: sign * t.values[0])
        del self.best[self.keep_best:]

    def trim(self) -> None:
        """Forget finished trials older than the window that are not among the best (memory
        stays bounded; they are still in the database)."""
        if self.max_history is None or len(self.ordered) <= self.max_history * 5 // 4:
            return
        keep = {t._trial_id for t in self.best} | self.unfinished
        window = self.ordered[-self.max_history:]
        old = [t for t in self.ordered[:-self.max_history] if t._trial_id in keep]
        for t in self.ordered[:-self.max_history]:
            if t._trial_id not in keep:
                del self.by_id[t._trial_id]
        self.ordered = old + window

    def view(self) -> list[FrozenTrial]:
        """What the sampler sees: the window, the best older trials and unfinished ones."""
        if self.max_history is None or len(self.ordered) <= self.max_history:
            return list(self.ordered)
        window = self.ordered[-self.max_history:]
        first = window[0].number
        keep = {t._trial_id for t in self.best} | self.unfinished
        older = [t for t in self.ordered[:-self.max_history] if t._trial_id in keep]
        assert all(t.number < first for t in older)
        return older + window
