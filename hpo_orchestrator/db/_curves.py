"""Learning curves and step timings: what ``tune-pruner`` replays and ``min_resource=auto``
resumes from."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

from hpo_orchestrator import keys
from hpo_orchestrator.db._sql import rows, scalar
from hpo_orchestrator.db._study import state_name

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable as Connection

__all__ = ["CurveTrial", "first_of_last", "intermediate_values", "step_timings", "trials_with_values"]

# Every read here takes :first, the lowest trial number wanted (0: the whole study), so that
# tune-pruner and report can read the newest trials of a study of 100k+ (first_of_last).
_TRIALS_SQL = (
    "SELECT t.trial_id, t.number, t.state, v.value FROM trials t LEFT JOIN trial_values v "
    "ON v.trial_id = t.trial_id AND v.objective = 0 WHERE t.study_id = :s AND t.number >= :first "
    "ORDER BY t.number")
_INTERMEDIATE_SQL = (
    "SELECT iv.trial_id, iv.step, iv.intermediate_value FROM trial_intermediate_values iv "
    "JOIN trials t ON t.trial_id = iv.trial_id WHERE t.study_id = :s AND t.number >= :first "
    "ORDER BY iv.trial_id, iv.step")
_LAST_NUMBER_SQL = "SELECT MAX(number) FROM trials WHERE study_id = :s"
_TIMINGS_SQL = (
    "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a JOIN trials t "
    "ON t.trial_id = a.trial_id WHERE t.study_id = :s AND t.number >= :first "
    "AND a.key IN ('hpo.overhead_s', 'hpo.step_s')")

_WORKER_FIRSTS_SQL = (
    "SELECT a.trial_id FROM trial_user_attributes a JOIN trials t ON t.trial_id = a.trial_id "
    "WHERE t.study_id = :s AND t.number >= :first AND a.key = 'hpo.worker_trial' "
    "AND a.value_json = '1'")


class CurveTrial(NamedTuple):
    trial_id: int
    number: int
    state: str
    value: float | None  # the first objective's value, None unless COMPLETE


def first_of_last(connection: Connection, study_id: int, last: int | None) -> int:
    """The lowest trial number of the study's newest ``last`` trials (0 for None: all)."""
    if last is None:
        return 0
    newest = scalar(connection, _LAST_NUMBER_SQL, {"s": study_id})
    return 0 if newest is None else max(0, int(newest) - last + 1)


def trials_with_values(connection: Connection, study_id: int, first: int = 0) -> list[CurveTrial]:
    """Every trial of the study from number ``first`` on, in number order, with its value where
    it has one."""
    return [CurveTrial(int(trial_id), int(number), state_name(state), None if value is None else float(value))
            for trial_id, number, state, value
            in rows(connection, _TRIALS_SQL, {"s": study_id, "first": first})]


def intermediate_values(connection: Connection, study_id: int,
                        first: int = 0) -> dict[int, list[tuple[int, float]]]:
    """trial_id -> its reported (step, value), by step (NaN where Optuna stored none), for the
    trials from number ``first`` on."""
    steps: dict[int, list[tuple[int, float]]] = {}
    for trial_id, step, value in rows(connection, _INTERMEDIATE_SQL, {"s": study_id, "first": first}):
        steps.setdefault(int(trial_id), []).append(
            (int(step), float("nan") if value is None else float(value)))
    return steps


def step_timings(connection: Connection, study_id: int, first: int = 0) -> dict[int, tuple[float, float]]:
    """trial_id -> (overhead_s, step_s) the orchestrator recorded (attrs hpo.overhead_s,
    hpo.step_s), for the trials from number ``first`` on that have both."""
    found: dict[int, dict[str, float]] = {}
    for trial_id, key, value in rows(connection, _TIMINGS_SQL, {"s": study_id, "first": first}):
        found.setdefault(int(trial_id), {})[key] = float(json.loads(value))
    return {trial_id: (v[keys.OVERHEAD_S], v[keys.STEP_S]) for trial_id, v in found.items() if len(v) == 2}


def worker_firsts(connection: Connection, study_id: int, first: int = 0) -> set[int]:
    """The trial_ids, from number ``first`` on, that were their worker's first trial (attr
    hpo.worker_trial 1): the worker's start-up (imports, data, CUDA) ran inside them."""
    return {int(trial_id) for (trial_id,) in rows(connection, _WORKER_FIRSTS_SQL,
                                                  {"s": study_id, "first": first})}
