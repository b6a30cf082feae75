"""The statements behind a study's tally (study/_tally.py): its row, the trials since its
watermark, the summary rows of the trials it folded in, and the reads status makes of the
summary's indexes instead of visiting every row (medians as an OFFSET, flags, failures).

Every read of the summary here stops at the watermark (``trial_id <= :w``): rows above it
belong to trials status reads one by one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from hpo_orchestrator.db._sql import dialect, fetch_all, fetch_one, has_table, rows, scalar
from hpo_orchestrator.db._study import state_name, to_datetime
from hpo_orchestrator.db._summary import FLAGGED_WHERE, SUMMARY_COLUMNS, SummaryRow
from hpo_orchestrator.db._trials import _ATTR_KEYS, SummaryFlags, TrialRow, from_attrs

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable

__all__ = ["SinceTrial", "existing_ids", "fail_attrs", "failed_upto", "flags_upto", "has_tally_table",
           "ordered_window", "read_tally", "summarize", "summary_count_upto", "trials_since",
           "write_tally"]

_TALLY_SQL = "SELECT version, tally FROM hpo_study_tally WHERE study_id = :s"
_TALLY_UPDATE_SQL = "UPDATE hpo_study_tally SET version = :v, tally = :t WHERE study_id = :s"
_TALLY_INSERT_SQL = "INSERT INTO hpo_study_tally (study_id, version, tally) VALUES (:s, :v, :t)"
_SUMMARIZE_SQL = (f"INSERT INTO hpo_trial_summary ({', '.join(SUMMARY_COLUMNS)}) "
                  f"VALUES ({', '.join(':' + c for c in SUMMARY_COLUMNS)})")
_TALLY_LOCK_SQL = _TALLY_SQL + " FOR UPDATE"  # PostgreSQL: one writer of a study's tally at once
# Each read of the trials since runs twice, for ids above the watermark and for the holes: an
# OR of the two would make sqlite scan the study's trials instead of a range of its index.
_SINCE = ("t.trial_id > :w", "t.trial_id IN :holes")
_SINCE_TRIALS_SQL = (
    "SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete, "
    "(SELECT MAX(iv.step) FROM trial_intermediate_values iv WHERE iv.trial_id = t.trial_id), "
    "(SELECT v.value FROM trial_values v WHERE v.trial_id = t.trial_id AND v.objective = 0) "
    "FROM trials t WHERE t.study_id = :s AND {since}")
# trial_id, TrialRow's columns, SummaryFlags' (its number is TrialRow's)
_SINCE_COLUMNS = ("trial_id", *TrialRow._fields, *SummaryFlags._fields[1:])
_SINCE_SUMMARY_SQL = (
    f"SELECT {', '.join('t.' + c for c in _SINCE_COLUMNS)} "
    "FROM hpo_trial_summary t WHERE t.study_id = :s AND {since}")
_SINCE_ATTRS_SQL = (
    "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a JOIN trials t "
    "ON t.trial_id = a.trial_id WHERE t.study_id = :s AND {since} AND a.key IN :keys")
_EXISTING_IDS_SQL = ("SELECT trial_id FROM trials WHERE (trial_id > :lo AND trial_id <= :hi) "
                     "OR trial_id IN :holes")
_COUNT_UPTO_SQL = "SELECT COUNT(*) FROM hpo_trial_summary WHERE study_id = :s AND trial_id <= :w"
_COUNT_HOLES_SQL = "SELECT COUNT(*) FROM hpo_trial_summary WHERE trial_id IN :holes"
# The expression and the filters are the index's (db/_schema.py), so sqlite walks it in order;
# ``+trial_id`` keeps sqlite from preferring the study_id index for the watermark's range (then
# it sorts every row: 0.10 s against 0.013 s on 100k trials).
_UPTO = "+trial_id <= :w AND trial_id NOT IN :holes"  # folded: up to the watermark, no hole
_ORDERED_SQL = {
    "duration": ("SELECT end_s - start_s FROM hpo_trial_summary WHERE study_id = :s AND state = :state "
                 f"AND end_s - start_s IS NOT NULL AND {_UPTO} ORDER BY end_s - start_s "
                 "LIMIT :n OFFSET :o"),
    "startup_s": ("SELECT startup_s FROM hpo_trial_summary WHERE study_id = :s AND startup_s IS NOT "
                  f"NULL AND first_decision_s IS NOT NULL AND {_UPTO} ORDER BY startup_s "
                  "LIMIT :n OFFSET :o"),
    "first_decision_s": ("SELECT first_decision_s FROM hpo_trial_summary WHERE study_id = :s AND "
                         f"first_decision_s IS NOT NULL AND startup_s IS NOT NULL AND {_UPTO} "
                         "ORDER BY first_decision_s LIMIT :n OFFSET :o")}
_DURATION_WINDOW_SQL = _ORDERED_SQL["duration"]
_STARTUP_WINDOW_SQL = _ORDERED_SQL["startup_s"]
_DECISION_WINDOW_SQL = _ORDERED_SQL["first_decision_s"]
_FLAGS_UPTO_SQL = (
    f"SELECT {', '.join(SummaryFlags._fields)} FROM "
    f"hpo_trial_summary WHERE study_id = :s AND ({FLAGGED_WHERE}) AND {_UPTO}")
_FAILED_UPTO_SQL = ("SELECT trial_id FROM hpo_trial_summary WHERE study_id = :s "
                    f"AND state = 'FAIL' AND {_UPTO}")
_FAIL_ATTRS_SQL = (
    "SELECT t.number, a.key, a.value_json FROM trials t JOIN trial_user_attributes a "
    "ON a.trial_id = t.trial_id WHERE t.trial_id IN :ids "
    "AND a.key IN ('hpo.error', 'hpo.fail_reason', 'hpo.retried', 'hpo.pid')")


class SinceTrial(NamedTuple):
    """A trial above the watermark or in a hole: its row, flags and value, from its summary
    row when it has one, else from Optuna's tables and its ``hpo.*`` attrs."""

    trial_id: int
    row: TrialRow
    flags: SummaryFlags
    attrs: dict[str, Any]  # {} when summarized
    value: float | None  # the first objective's
    summarized: bool
    summary: SummaryRow | None = None  # the row to write for one that has none (summarize)


def has_tally_table(connection: Readable) -> bool:
    return has_table(connection, "hpo_study_tally")


def read_tally(connection: Readable, study_id: int, for_update: bool = False) -> tuple[int, str] | None:
    """(version, JSON) of the study's tally; ``for_update`` locks its row until the
    transaction ends (PostgreSQL; sqlite's writer lock serializes writers anyway)."""
    sql = _TALLY_LOCK_SQL if for_update and dialect(connection) == "postgresql" else _TALLY_SQL
    row = fetch_one(connection, sql, {"s": study_id})
    return None if row is None else (int(row[0]), row[1])


def write_tally(connection: Readable, study_id: int, version: int, tally: str) -> None:
    params = {"s": study_id, "v": version, "t": tally}
    if not rows(connection, _TALLY_UPDATE_SQL, params).rowcount:
        rows(connection, _TALLY_INSERT_SQL, params)


def _since(connection: Readable, sql: str, params: dict[str, Any]) -> list[Any]:
    """The rows of ``sql`` for the ids above the watermark, then for the holes."""
    expanding = ["keys"] if "keys" in params else []
    found = fetch_all(connection, sql.format(since=_SINCE[0]), params, expanding)
    if params["holes"]:
        found += fetch_all(connection, sql.format(since=_SINCE[1]), params, [*expanding, "holes"])
    return found


def trials_since(connection: Readable, study_id: int, watermark: int,
                 holes: list[int]) -> list[SinceTrial]:
    """The study's trials with an id above ``watermark`` or in ``holes``, by trial_id."""
    params: dict[str, Any] = {"s": study_id, "w": watermark, "holes": list(holes)}
    values: dict[int, Any] = {}
    trials = {}
    for trial_id, number, state, start, end, last_step, value in _since(
            connection, _SINCE_TRIALS_SQL, params):
        trials[int(trial_id)] = (int(number), state_name(state), to_datetime(start),
                                 to_datetime(end), last_step)
        values[int(trial_id)] = value
    found = {}
    for r in _since(connection, _SINCE_SUMMARY_SQL, params):
        trial_id = int(r[0])
        if trial_id in trials:
            split = 1 + len(TrialRow._fields)
            found[trial_id] = SinceTrial(trial_id, TrialRow(*r[1:split]),
                                         SummaryFlags.read((r[1], *r[split:])), {},
                                         values[trial_id], True)
    attrs: dict[int, dict[str, Any]] = {}
    if len(found) < len(trials):
        for trial_id, key, value in _since(connection, _SINCE_ATTRS_SQL,
                                           {**params, "keys": list(_ATTR_KEYS)}):
            if int(trial_id) not in found:
                attrs.setdefault(int(trial_id), {})[key] = json.loads(value)
    for trial_id, (number, state, start, end, last_step) in trials.items():
        if trial_id not in found:
            a = attrs.get(trial_id, {})
            row = from_attrs(trial_id, study_id, number, state, start, end, last_step, a)
            found[trial_id] = SinceTrial(trial_id, TrialRow.of(row), SummaryFlags.of(row), a,
                                         values[trial_id], False, row)
    return [found[t] for t in sorted(found)]


def summarize(connection: Readable, study_id: int, trial: SinceTrial) -> None:
    """A summary row for a trial that ended outside the orchestrator, from its attrs (as the
    orchestrator writes one for its own), so the summary's indexes cover every folded trial."""
    if trial.summary is None:
        raise ValueError(f"trial {trial.trial_id} has its summary row already")
    rows(connection, _SUMMARIZE_SQL, {**trial.summary.values(), "study_id": study_id})


def existing_ids(connection: Readable, lo: int, hi: int, holes: list[int]) -> set[int]:
    """Trial ids in (lo, hi] or in ``holes`` that exist, in any study."""
    return {int(t) for (t,) in rows(connection, _EXISTING_IDS_SQL,
                                    {"lo": lo, "hi": hi, "holes": list(holes)}, ["holes"])}


def summary_count_upto(connection: Readable, study_id: int, watermark: int,
                       holes: list[int]) -> tuple[int, int]:
    """Summary rows of the study up to the watermark, and how many of them are holes' (a hole
    summarized since the tally was read, or by an older orchestrator)."""
    upto = scalar(connection, _COUNT_UPTO_SQL, {"s": study_id, "w": watermark})
    in_holes = scalar(connection, _COUNT_HOLES_SQL, {"holes": list(holes)}, ["holes"]) if holes else 0
    return int(upto or 0), int(in_holes or 0)


def ordered_window(connection: Readable, study_id: int, watermark: int, holes: list[int], what: str,
                   offset: int, limit: int, state: str | None = None) -> list[float]:
    """Values ``offset`` to ``offset + limit`` of the folded trials' ``what`` (duration of
    ``state``, startup_s, first_decision_s of the trials that have both), in order. Holes are
    left out here and below: one summarized since the tally was read is among the trials since."""
    params: dict[str, Any] = {"s": study_id, "w": watermark, "holes": holes, "n": limit, "o": offset}
    if state is not None:
        params["state"] = state
    return [float(v) for (v,) in rows(connection, _ORDERED_SQL[what], params, ["holes"])]


def flags_upto(connection: Readable, study_id: int, watermark: int, holes: list[int]) -> list[SummaryFlags]:
    return [SummaryFlags.read(r) for r in rows(
        connection, _FLAGS_UPTO_SQL, {"s": study_id, "w": watermark, "holes": holes}, ["holes"])]


def failed_upto(connection: Readable, study_id: int, watermark: int, holes: list[int]) -> list[int]:
    return [int(t) for (t,) in rows(connection, _FAILED_UPTO_SQL,
                                    {"s": study_id, "w": watermark, "holes": holes}, ["holes"])]


def fail_attrs(connection: Readable, trial_ids: list[int]) -> dict[int, dict[str, Any]]:
    """number -> the failure attrs of those trials that have any (as db.fail_errors reads)."""
    found: dict[int, dict[str, Any]] = {}
    if trial_ids:
        for number, key, value in rows(connection, _FAIL_ATTRS_SQL, {"ids": list(trial_ids)}, ["ids"]):
            found.setdefault(int(number), {})[key] = json.loads(value)
    return found
