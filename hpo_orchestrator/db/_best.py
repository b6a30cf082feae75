"""The reads behind ``hpo-orchestrator best`` and ``enqueue``: a study's directions, its
completed trials' values (every objective), a trial's params, and the search space its trials
used. One query per concern, never the ORM."""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, NamedTuple

from hpo_orchestrator.db._sql import fetch_all, rows
from hpo_orchestrator.db._study import state_name
from hpo_orchestrator.db._trial_rows import _param_value

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable

__all__ = ["ScoredTrial", "best_trials", "pareto_front", "study_directions", "study_space",
           "trial_params"]

_DIRECTIONS_SQL = "SELECT direction FROM study_directions WHERE study_id = :s ORDER BY objective"
# Every objective's value of every COMPLETE trial; an infinite value is stored as NULL with
# its value_type, and such a trial is left out (it can be no one's best).
_COMPLETE_VALUES_SQL = (
    "SELECT t.trial_id, t.number, v.objective, v.value FROM trials t JOIN trial_values v "
    "ON v.trial_id = t.trial_id WHERE t.study_id = :s AND t.state = 'COMPLETE' "
    "ORDER BY t.number, v.objective")
_PARAMS_SQL = ("SELECT param_name, param_value, distribution_json FROM trial_params "
               "WHERE trial_id = :t ORDER BY param_id")
# Each param name's distribution as the study's latest trial with it suggested it.
_SPACE_SQL = (
    "SELECT p.param_name, p.distribution_json FROM trial_params p WHERE p.param_id IN ("
    "SELECT MAX(q.param_id) FROM trial_params q JOIN trials t ON t.trial_id = q.trial_id "
    "WHERE t.study_id = :s GROUP BY q.param_name) ORDER BY p.param_name")


class ScoredTrial(NamedTuple):
    trial_id: int
    number: int
    values: tuple[float, ...]


def study_space(connection: Readable, study_id: int) -> dict[str, str]:
    """{param name: Optuna's distribution JSON} of every param the study's trials suggested
    (the latest trial's, where they differ); empty before any trial suggested one."""
    return {str(name): str(distribution)
            for name, distribution in rows(connection, _SPACE_SQL, {"s": study_id})}


def study_directions(connection: Readable, study_id: int) -> list[str]:
    """'minimize' / 'maximize' per objective, in order."""
    return [state_name(row[0]).lower()
            for row in rows(connection, _DIRECTIONS_SQL, {"s": study_id})]


def _complete(connection: Readable, study_id: int, objectives: int) -> list[ScoredTrial]:
    found: dict[int, tuple[int, dict[int, float | None]]] = {}
    for trial_id, number, objective, value in rows(
            connection, _COMPLETE_VALUES_SQL, {"s": study_id}):
        found.setdefault(int(trial_id), (int(number), {}))[1][int(objective)] = \
            None if value is None else float(value)
    trials = []
    for trial_id, (number, values) in found.items():
        ordered = [values.get(i) for i in range(objectives)]
        if all(v is not None for v in ordered):
            trials.append(ScoredTrial(trial_id, number, tuple(v for v in ordered if v is not None)))
    return trials


def pareto_front(trials: list[ScoredTrial], directions: list[str]) -> list[ScoredTrial]:
    """The trials no other trial dominates (at least as good in every objective, better in
    one), by number; with one objective, the best trial (the earliest of equals)."""
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]

    def key(trial: ScoredTrial) -> tuple[float, ...]:
        return tuple(map(operator.mul, signs, trial.values))

    if len(directions) == 1:
        return [min(trials, key=lambda t: (key(t), t.number))] if trials else []
    # In lexicographic order a trial's dominators come before it, and a trial dominated by
    # anything is dominated by a front member; a trial equal to a front member is on the front
    # too (equals do not dominate), and equals are neighbours in that order.
    ordered = sorted(((key(t), t) for t in trials), key=lambda kt: (kt[0], kt[1].number))
    front: list[tuple[tuple[float, ...], ScoredTrial]] = []
    if len(directions) == 2:
        # Two objectives (the common case): one sweep, O(n log n). Every earlier trial is at
        # least as good in the first, so the least second value so far decides.
        least = math.inf
        for k, t in ordered:
            if k[1] < least or (front and front[-1][0] == k):
                front.append((k, t))
                least = min(least, k[1])
    else:  # against the front so far: O(n x front), not O(n^2)
        for k, t in ordered:
            if not any(o != k and all(a <= b for a, b in zip(o, k, strict=True))
                       for o, _ in front):
                front.append((k, t))
    return sorted((t for _, t in front), key=lambda t: t.number)


def best_trials(connection: Readable, study_id: int) -> tuple[list[str], list[ScoredTrial]]:
    """The study's directions and its best trial (one objective) or Pareto front (several)."""
    directions = study_directions(connection, study_id) or ["minimize"]
    return directions, pareto_front(_complete(connection, study_id, len(directions)), directions)


def trial_params(connection: Readable, trial_id: int) -> dict[str, Any]:
    """The trial's params as the objective received them (categoricals as their choice), in
    the order they were suggested."""
    return {name: _param_value(value, distribution)
            for name, value, distribution in fetch_all(connection, _PARAMS_SQL, {"t": trial_id})}
