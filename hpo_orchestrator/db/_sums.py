"""Status's numbers over ``hpo_trial_summary`` as SQL aggregates: counts, sums, maxima and
medians come back as a few rows whatever the study's size; only the busy time needs each
trial's (start, end).

Fetching one wide row per trial and summing in Python was most of ``status``'s time on 100k
trials (docs/BENCHMARKS.md "Status on a large study"). A median is the middle row(s) of an
ORDER BY, so it is the very float Python's statistics.median picked. Plain SQL (CASE,
COALESCE): sqlite and PostgreSQL alike.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._study import state_name

__all__ = ["DurationSums", "GroupSums", "summary_durations", "summary_group_sums", "summary_intervals",
           "summary_median", "summary_values"]

_DURATIONS_SQL = (
    "SELECT state, COUNT(*), SUM(end_s - start_s), MAX(end_s - start_s) FROM hpo_trial_summary "
    "WHERE study_id = :s AND start_s IS NOT NULL AND end_s IS NOT NULL GROUP BY state")
# The middle one or two values of a column, for the median (statistics.median's definition).
_DURATION_MEDIAN_SQL = (
    "SELECT end_s - start_s AS v FROM hpo_trial_summary WHERE study_id = :s AND state = :state "
    "AND start_s IS NOT NULL AND end_s IS NOT NULL ORDER BY v LIMIT :k OFFSET :o")
_PAIRED = "study_id = :s AND startup_s IS NOT NULL AND first_decision_s IS NOT NULL"
_STARTUP_MEDIAN_SQL = (
    f"SELECT startup_s AS v FROM hpo_trial_summary WHERE {_PAIRED} ORDER BY v LIMIT :k OFFSET :o")
_DECISION_MEDIAN_SQL = (
    f"SELECT first_decision_s AS v FROM hpo_trial_summary WHERE {_PAIRED} ORDER BY v LIMIT :k OFFSET :o")
_MEDIANS = {"duration": _DURATION_MEDIAN_SQL, "startup": _STARTUP_MEDIAN_SQL,
            "first_decision": _DECISION_MEDIAN_SQL}
# Trials run by an orchestrator (a host or a GPU recorded), per device and state: counts, the
# duration-weighted utilization sums (a running trial's duration runs to :now), energy, and the
# span and start-up figures that status needs of every summarized trial, in one scan.
_ON_DEVICE = "study_id = :s AND (host IS NOT NULL OR gpu_index IS NOT NULL)"
_WEIGHT = "(COALESCE(end_s, :now) - start_s)"
_GROUP_SUMS_SQL = (
    "SELECT host, gpu_index, state, MIN(trial_id), COUNT(*), "
    f"SUM(CASE WHEN start_s IS NOT NULL THEN gpu_util_mean * {_WEIGHT} END), "
    f"SUM(CASE WHEN start_s IS NOT NULL AND gpu_util_mean IS NOT NULL THEN {_WEIGHT} END), "
    f"SUM(CASE WHEN start_s IS NOT NULL THEN gpu_util_compute_mean * {_WEIGHT} END), "
    f"SUM(CASE WHEN start_s IS NOT NULL AND gpu_util_compute_mean IS NOT NULL THEN {_WEIGHT} END), "
    "SUM(gpu_energy_j), COUNT(gpu_energy_j), MIN(start_s), MAX(start_s), "
    "MAX(CASE WHEN start_s IS NOT NULL THEN COALESCE(end_s, :now) END), "
    "SUM(CASE WHEN startup_s IS NOT NULL AND first_decision_s IS NOT NULL THEN 1 ELSE 0 END) "
    "FROM hpo_trial_summary WHERE study_id = :s GROUP BY host, gpu_index, state")
# The summarized trials' (start, end) per device, for the busy time: a sweep over them sorted is
# several times faster in Python than the same sweep as a window function in sqlite, whose
# sorter is slow on 100k rows. Through the DBAPI cursor, like _trials.summary_rows; the
# parameters are an int and a float formatted in, so the driver's paramstyle does not matter.
_INTERVALS_SQL = (
    "SELECT host, gpu_index, start_s, COALESCE(end_s, {now!r}) FROM hpo_trial_summary "
    "WHERE study_id = {study_id:d} AND (host IS NOT NULL OR gpu_index IS NOT NULL) "
    "AND start_s IS NOT NULL")


class DurationSums(NamedTuple):
    """Summarized trials of one state that have both timestamps."""

    trials: int
    total_s: float
    max_s: float


class GroupSums(NamedTuple):
    """Summarized trials of one state on one device (host and gpu_index both None: not run
    by an orchestrator)."""

    host: str | None
    gpu_index: int | None
    state: str
    first_trial_id: int  # the states of a device are listed in the order they first occurred
    trials: int
    util_weighted: float | None  # sum of util x duration
    util_weight: float | None  # sum of the durations of trials with a util
    compute_weighted: float | None
    compute_weight: float | None
    energy_j: float | None
    energy_trials: int
    first_start: float | None
    last_start: float | None
    last_end: float | None  # :now for a trial without an end
    startup_pairs: int  # trials with both startup_s and first_decision_s

    @property
    def on_device(self) -> bool:
        return self.host is not None or self.gpu_index is not None


def summary_durations(connection: Connection, study_id: int) -> dict[str, DurationSums]:
    """state -> how many summarized trials have a duration, their sum and their longest."""
    return {state_name(state): DurationSums(int(n), float(total), float(longest))
            for state, n, total, longest in connection.execute(text(_DURATIONS_SQL), {"s": study_id})}


def summary_median(connection: Connection, study_id: int, column: str, count: int,
                   state: str | None = None) -> float | None:
    """The median of the ``count`` values of a column (``duration`` of ``state``'s trials, or
    ``startup`` / ``first_decision`` of the trials that have both): the middle value, or the
    mean of the middle two."""
    if count <= 0:
        return None
    middle = _sorted_values(connection, study_id, column, state, 2 - count % 2, (count - 1) // 2)
    return middle[0] if len(middle) == 1 else (middle[0] + middle[1]) / 2


def summary_values(connection: Connection, study_id: int, column: str, count: int,
                   state: str | None = None) -> list[float]:
    """All ``count`` values of such a column, for a median with values from elsewhere."""
    return _sorted_values(connection, study_id, column, state, count, 0) if count > 0 else []


def _sorted_values(connection: Connection, study_id: int, column: str, state: str | None,
                   limit: int, offset: int) -> list[float]:
    params = {"s": study_id, "state": state, "k": limit, "o": offset}
    return [float(v) for (v,) in connection.execute(text(_MEDIANS[column]), params)]


def summary_group_sums(connection: Connection, study_id: int, now: float) -> list[GroupSums]:
    """The summarized trials' sums per device and state."""
    found = []
    for host, gpu, state, first, n, uw, w, cw, c, energy, energy_n, lo, mid, hi, pairs in connection.execute(
            text(_GROUP_SUMS_SQL), {"s": study_id, "now": now}):
        found.append(GroupSums(host, None if gpu is None else int(gpu), state_name(state), int(first),
                               int(n), _float(uw), _float(w), _float(cw), _float(c), _float(energy),
                               int(energy_n), _float(lo), _float(mid), _float(hi), int(pairs)))
    return found


def summary_intervals(connection: Connection, study_id: int, now: float
                      ) -> dict[tuple[str | None, int | None], list[tuple[float, float]]]:
    """(host, gpu) -> (start, end or ``now``) of each summarized trial run on it."""
    cursor = connection.connection.cursor()
    try:
        cursor.execute(_INTERVALS_SQL.format(study_id=int(study_id), now=float(now)))
        rows = cursor.fetchall()
    finally:
        cursor.close()
    found: dict[tuple[str | None, int | None], list[tuple[float, float]]] = {}
    for host, gpu, start, end in rows:
        found.setdefault((host, gpu), []).append((start, end))
    return found


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
