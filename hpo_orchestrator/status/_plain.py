"""A study plain Optuna wrote: its finished trials folded from one narrow read.

A database no orchestrator has written to (no ``hpo_trial_summary`` table, no ``hpo.*`` attr on
any trial) holds no device, host, start-up time, flag or failure reason of ours: what the tally
holds of its finished trials is counts, durations, last steps, the best value and the study's
window. Those are folded here from one read of each finished state, a column at a time, without
the row objects and per-device unions of the trial-by-trial fold (tally/_tally.py's
Tally.add), which cost over a second more on 100,000 trials (docs/benchmarks/status.md "A study
plain Optuna wrote"). Its unfinished trials are the tally's holes, folded in one by one as any other's.
tests/status/test_plain_status.py holds this fold to a visit of every trial.
"""

from __future__ import annotations

import operator
from collections import Counter
from functools import reduce
from typing import TYPE_CHECKING, Any, cast

from hpo_orchestrator.db import (
    fetch_all,
    fetch_one,
    has_summary_table,
    rows,
    scalar,
    to_epochs,
)
from hpo_orchestrator.tally import Tally

if TYPE_CHECKING:
    from hpo_orchestrator.db import Readable

__all__ = ["PlainStudy", "is_plain"]

_FINISHED = ("COMPLETE", "PRUNED", "FAIL")
_HPO_ATTR_SQL = "SELECT 1 FROM trial_user_attributes WHERE key LIKE 'hpo.%' LIMIT 1"
# The trials of one finished state: start, end, last step (one index seek a trial), and a
# COMPLETE one's value, number and id (the best trials)
_FINISHED_SQL = (
    "SELECT t.datetime_start, t.datetime_complete, (SELECT MAX(iv.step) FROM "
    "trial_intermediate_values iv WHERE iv.trial_id = t.trial_id), CASE t.state WHEN 'COMPLETE' "
    "THEN (SELECT v.value FROM trial_values v WHERE v.trial_id = t.trial_id AND v.objective = 0) "
    "END, t.number, t.trial_id FROM trials t WHERE t.study_id = :s AND t.state = :state "
    "ORDER BY t.trial_id")
_TOP_SQL = "SELECT MAX(trial_id) FROM trials WHERE study_id = :s"
_UNFINISHED_SQL = ("SELECT trial_id FROM trials WHERE study_id = :s "
                   "AND state NOT IN ('COMPLETE', 'PRUNED', 'FAIL')")


def is_plain(connection: Readable) -> bool:
    """No orchestrator has written to this database (a scan of the attrs' table when none)."""
    return not has_summary_table(connection) and fetch_one(connection, _HPO_ATTR_SQL) is None


class PlainStudy:
    """The finished trials of a plain study, folded into ``tally`` as Tally.add would fold
    them one by one (``now``: the end of a finished trial that has none), and their durations
    by state, in order, for the medians."""

    def __init__(self, connection: Readable, study_id: int, name: str, now: float) -> None:
        self.tally = tally = Tally(study_name=name)
        params = {"s": study_id}
        self.durations: dict[str, list[float]] = {}
        starts: list[float] = []
        ends: list[float] = []
        for state in _FINISHED:  # a read each: no state to tell apart row by row
            found = fetch_all(connection, _FINISHED_SQL, {**params, "state": state})
            if found:
                _fold_state(tally, state, found)
                timed = self._timed(state, found, now)
                starts += [start for start, _ in timed]
                ends += [end for _, end in timed]
        if starts:
            tally.window = [min(starts), max(starts), max(ends)]
        tally.folded = sum(tally.states.values())
        # Read after the sums: a trial that finishes in between (each statement has a
        # snapshot of its own on PostgreSQL; sqlite reads all in one) is left out of both,
        # never counted twice
        tally.watermark = int(scalar(connection, _TOP_SQL, params) or 0)
        tally.holes = [int(t) for (t,) in rows(connection, _UNFINISHED_SQL, params)]

    def _timed(self, state: str, found: list[Any], now: float) -> list[tuple[float, float]]:
        """The state's trials' (start, end), ``now`` for an end they lack, and their
        durations kept in order, for the medians."""
        timed = cast("list[tuple[float, float | None]]", [
            (start, end) for start, end in zip(to_epochs([row[0] for row in found]),
                                               to_epochs([row[1] for row in found]),
                                               strict=True) if start is not None])
        durations = [end - start for start, end in timed if end is not None]
        if durations:
            # added in trial order, as the fold adds them (sum() compensates from 3.12 on)
            total = reduce(operator.add, durations, 0.0)
            self.tally.durations[state] = [len(durations), total, max(durations)]
            self.durations[state] = sorted(durations)
        return [(start, now if end is None else end) for start, end in timed]

    def ordered(self, what: str, offset: int, limit: int, state: str | None = None) -> list[float]:
        """Durations ``offset`` to ``offset + limit`` of the ``state`` trials, in order (as
        _tally.ordered_window; a plain study has no start-up times)."""
        assert what == "duration", what
        return self.durations.get(state or "", [])[offset:offset + limit]


def _fold_state(tally: Tally, state: str, found: list[Any]) -> None:
    """A state's count, and what its trials add: PRUNED their steps, COMPLETE the largest
    step and the best values (the lowest number among equals, as Tally.add)."""
    tally.states[state] = len(found)
    steps = [row[2] for row in found if row[2] is not None]
    if state == "PRUNED":
        tally.prune_steps = dict(sorted(Counter(steps).items()))
    elif state == "COMPLETE":
        tally.max_complete_step = max(0, *steps) if steps else None
        valued = [(float(value), number, trial_id)
                  for _, _, _, value, number, trial_id in found if value is not None]
        if valued:
            tally.best_min = list(min(valued))
            top = max(valued)[0]
            tally.best_max = list(min(v for v in valued if v[0] == top))
