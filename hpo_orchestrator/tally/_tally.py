"""A study's tally: what ``status`` shows, summed over its finished trials, kept as one JSON row
(``hpo_study_tally``) so that status reads it and the trials since instead of every trial.

What it holds is what can be summed exactly one trial at a time: counts, sums, maxima, the prune
steps, the best value, and per device and per host the union of its trials' intervals. Medians
are not in it: they are read as an OFFSET into an index of ``hpo_trial_summary`` (the reads
below), which holds a row for every trial the tally has folded in.

Which trials are in it: every trial of the study with ``trial_id <= watermark``, except
``holes`` (trials seen unfinished, or ids not yet committed on PostgreSQL). A finished trial is
never changed by Optuna (UpdateFinishedTrialError), so a trial folded in stays right; holes
and trials above the watermark are read again by every status and folded in by a later
trial's end (at most once a second) or the run's end (docs/BENCHMARKS.md "status from a kept
tally").

Its statements are here too: the tally's row, the trials since its watermark, the summary rows
of the trials it folded in, and the reads status makes of the summary's indexes instead of
visiting every row (medians as an OFFSET, flags, failures). Every read of the summary stops at
the watermark (``trial_id <= :w``): rows above it belong to trials status reads one by one.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from hpo_orchestrator.db import (
    ATTR_KEYS,
    FLAGGED_WHERE,
    SUMMARY_COLUMNS,
    SummaryFlags,
    SummaryRow,
    TrialRow,
    dialect,
    execute_many,
    fetch_all,
    fetch_one,
    from_attrs,
    has_table,
    rows,
    scalar,
    state_name,
)

if TYPE_CHECKING:
    from hpo_orchestrator.db import Readable

__all__ = ["VERSION", "DeviceTally", "SinceTrial", "Tally", "advance", "fail_attrs", "failed_upto",
           "flags_upto", "has_tally_table", "ordered_window", "other_studies_busy", "read_tally",
           "trials_since", "trusted"]

VERSION = 2  # of the JSON: a tally of another version is rebuilt by the next run
_HOLE_MARGIN_S = 1.0


def _start(segment: list[float]) -> float:
    return segment[0]


@dataclass
class DeviceTally:
    """One device's trials. Its busy time is the length of the union of their intervals:
    ``segments`` is that union as disjoint [start, end] pairs, sorted; the part before
    ``frontier`` is folded away into ``busy_done`` (no later trial can start before it), so the
    list stays as short as the trials running at once."""

    host: str | None
    gpu_index: int | None
    trials: int = 0
    states: dict[str, int] = field(default_factory=dict)
    util: list[float] = field(default_factory=lambda: [0.0, 0.0])  # sum of util * s, sum of s
    util_compute: list[float] = field(default_factory=lambda: [0.0, 0.0])
    energy: list[float] = field(default_factory=lambda: [0.0, 0.0])  # sum of joules, trials
    busy_done: float = 0.0
    frontier: float = -math.inf
    segments: list[list[float]] = field(default_factory=list)
    max_start: float | None = None
    max_end: float | None = None

    def add(self, row: TrialRow, end: float | None) -> bool:
        """Fold one trial in (``end``: its end, or now while it runs); False when its interval
        starts before the frontier (a clock set back, a trial added with old dates): the tally
        cannot place it, and status folds every trial into a fresh one instead."""
        # unpacked once: status without a kept tally folds every trial of the study
        _, state, _, _, start, _, _, _, util, util_compute, energy, _ = row
        self.trials += 1
        self.states[state] = self.states.get(state, 0) + 1
        if energy is not None:
            self.energy[0] += energy
            self.energy[1] += 1
        if start is None:
            return True
        end = end if end is not None else start
        for value, sums in ((util, self.util), (util_compute, self.util_compute)):
            if value is not None:
                sums[0] += value * (end - start)
                sums[1] += end - start
        self.max_start = start if self.max_start is None else max(self.max_start, start)
        if end <= start:  # an empty interval covers nothing
            return True
        if start < self.frontier:
            return False
        self.max_end = end if self.max_end is None else max(self.max_end, end)
        self._merge(start, end)
        return True

    def _merge(self, start: float, end: float) -> None:
        # by their starts, without a list of them: a fold of every trial (status without a
        # kept tally) merges each trial's interval into as many segments as trials so far
        lo = bisect.bisect_left(self.segments, start, key=_start)
        if lo > 0 and self.segments[lo - 1][1] >= start:
            lo -= 1
        hi = bisect.bisect_right(self.segments, end, key=_start)
        if lo < hi:
            start = min(start, self.segments[lo][0])
            end = max(end, self.segments[hi - 1][1])
        self.segments[lo:hi] = [[start, end]]

    def fold_before(self, frontier: float) -> None:
        """Sum away the segments that end before ``frontier``: no trial folded in from now on
        starts before it."""
        if frontier <= self.frontier:
            return
        while self.segments and self.segments[0][1] <= frontier:
            start, end = self.segments.pop(0)
            self.busy_done += end - start
        self.frontier = frontier

    def busy(self) -> float:
        return self.busy_done + sum(end - start for start, end in self.segments)

    def busy_until(self, moment: float) -> float:
        """The busy time before ``moment``, which lies at or after the frontier (what was
        folded away ends before it)."""
        return self.busy_done + sum(max(0.0, min(end, moment) - start)
                                    for start, end in self.segments)


@dataclass
class Tally:
    study_name: str = ""
    watermark: int = 0  # the highest trial_id looked at
    holes: list[int] = field(default_factory=list)  # ids <= watermark not folded in
    folded: int = 0  # trials folded in: each has a hpo_trial_summary row
    exact: bool = True  # False: a trial came that it cannot place; status folds afresh
    states: dict[str, int] = field(default_factory=dict)
    # state -> [trials with a duration, sum of durations, longest]
    durations: dict[str, list[float]] = field(default_factory=dict)
    prune_steps: dict[int, int] = field(default_factory=dict)
    max_complete_step: int | None = None
    pairs: int = 0  # trials with both startup_s and first_decision_s (slow_startup's medians)
    best_min: list[Any] | None = None  # [value, number, trial_id] of the lowest COMPLETE value
    best_max: list[Any] | None = None
    window: list[float] | None = None  # [first start, last start, last end]
    devices: list[DeviceTally] = field(default_factory=list)
    # Per host, the union of its trials' intervals, whatever their device: the time the
    # study's runs there had a trial running. A device's busy share is measured against its
    # host's, so the gaps between runs (a Ctrl-C and the resume, study.add_trials later)
    # count as nobody's. Per host, as a device: one host's trials start in its clock's order.
    hosts: list[DeviceTally] = field(default_factory=list)

    def add(self, trial_id: int, row: TrialRow, value: float | None, now: float,
            on_device: bool = True) -> None:
        """Fold in one trial: a finished one for good, or (on a copy, at read) a running one,
        whose end is ``now``. ``value``: its first objective's value, when COMPLETE (ties: the
        lowest number, as db.best_trial)."""
        # unpacked once: status without a kept tally folds every trial of the study
        number, state, host, gpu_index, start, end_s, startup, decision, _, _, _, last_step = row
        self.states[state] = self.states.get(state, 0) + 1
        if start is not None and end_s is not None:
            n, total, longest = self.durations.get(state, [0, 0.0, -math.inf])
            duration = end_s - start
            self.durations[state] = [n + 1, total + duration, max(longest, duration)]
        if last_step is not None and state == "PRUNED":
            self.prune_steps[last_step] = self.prune_steps.get(last_step, 0) + 1
        if last_step is not None and state == "COMPLETE":
            self.max_complete_step = max(self.max_complete_step or 0, last_step)
        if startup is not None and decision is not None:
            self.pairs += 1
        if value is not None and state == "COMPLETE":
            best = [value, number, trial_id]
            if self.best_min is None or best[:2] < self.best_min[:2]:
                self.best_min = best
            if self.best_max is None or (-value, number) < (-self.best_max[0], self.best_max[1]):
                self.best_max = best
        end = end_s if end_s is not None else now
        if start is not None:
            lo, hi, last = self.window or (start, start, end)
            self.window = [min(lo, start), max(hi, start), max(last, end)]
        if on_device and (host is not None or gpu_index is not None):
            if not self.device(host, gpu_index).add(row, end) or not self.host(host).add(row, end):
                self.exact = False

    def device(self, host: str | None, gpu_index: int | None) -> DeviceTally:
        for use in self.devices:
            if use.host == host and use.gpu_index == gpu_index:
                return use
        self.devices.append(DeviceTally(host, gpu_index))
        return self.devices[-1]

    def host(self, host: str | None) -> DeviceTally:
        for union in self.hosts:
            if union.host == host:
                return union
        self.hosts.append(DeviceTally(host, None))
        return self.hosts[-1]

    def fold_before(self, hole_starts: list[float]) -> None:
        """Shorten each device's segments: a trial folded in later is a hole now (it starts no
        earlier than its Optuna start: the orchestrator asks, then spawns) or not yet asked
        (it starts after every trial of its host so far: a device is one host's clock)."""
        # A hole's start is read from Optuna's datetime_start (microseconds, rounded): its
        # summary start may lie a little before it. A second of margin keeps it after the frontier.
        earliest = min(hole_starts, default=math.inf) - _HOLE_MARGIN_S
        for use in self.devices:
            if use.max_start is not None:
                use.fold_before(min(earliest, use.max_start))
        # a later trial starts after its own device's last start, maybe before another's
        for union in self.hosts:
            starts = [use.max_start for use in self.devices
                      if use.host == union.host and use.max_start is not None]
            if starts:
                union.fold_before(min(earliest, *starts))

    def to_json(self) -> str:
        data = asdict(self)
        data["prune_steps"] = {str(k): v for k, v in self.prune_steps.items()}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Tally:
        data = json.loads(text)
        data["prune_steps"] = {int(k): v for k, v in data["prune_steps"].items()}
        data["devices"] = [DeviceTally(**d) for d in data["devices"]]
        data["hosts"] = [DeviceTally(**d) for d in data["hosts"]]
        return cls(**data)


_TALLY_SQL = "SELECT version, tally FROM hpo_study_tally WHERE study_id = :s"
_TALLY_UPDATE_SQL = "UPDATE hpo_study_tally SET version = :v, tally = :t WHERE study_id = :s"
_TALLY_INSERT_SQL = "INSERT INTO hpo_study_tally (study_id, version, tally) VALUES (:s, :v, :t)"
_SUMMARIZE_SQL = (f"INSERT INTO hpo_trial_summary ({', '.join(SUMMARY_COLUMNS)}) "
                  f"VALUES ({', '.join(':' + c for c in SUMMARY_COLUMNS)})")
_TALLY_LOCK_SQL = _TALLY_SQL + " FOR UPDATE"  # PostgreSQL: one writer of a study's tally at once
# Each read of the trials since runs twice, for ids above the watermark and for the holes: an
# OR of the two would make sqlite scan the study's trials instead of a range of its index.
_SINCE = ("t.trial_id > :w", "t.trial_id IN :holes")
# With each trial's last step, which a trial without a summary row needs: one index seek a
# trial (a join grouped by trial reads every report: 6x as long on 100k trials of 20 steps)
_SINCE_TRIALS_SQL = (
    "SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete, "
    "CASE t.state WHEN 'COMPLETE' THEN (SELECT v.value FROM trial_values v "
    "WHERE v.trial_id = t.trial_id AND v.objective = 0) END, "
    "(SELECT MAX(iv.step) FROM trial_intermediate_values iv WHERE iv.trial_id = t.trial_id) "
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
# The expression and the filters are the index's (db/tables.py), so sqlite walks it in order;
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
# Other studies' finished trials on one GPU of a host (the same host name and NVML index is the
# same card), overlapping a window: a GPU busy with them was not idle
_OTHER_STUDIES_ON_GPU_SQL = (
    "SELECT start_s, end_s FROM hpo_trial_summary WHERE study_id <> :s AND host = :h "
    "AND gpu_index = :g AND start_s < :hi AND end_s > :lo")
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
    value: float | None  # the first objective's, of a COMPLETE trial
    summarized: bool


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


def trials_since(connection: Readable, study_id: int, watermark: int, holes: list[int],
                 has_summary: bool = True) -> list[SinceTrial]:
    """The study's trials with an id above ``watermark`` or in ``holes``, by trial_id
    (``has_summary``: False where the database has no summary table, e.g. plain Optuna's)."""
    params: dict[str, Any] = {"s": study_id, "w": watermark, "holes": list(holes)}
    trials = {int(r[0]): r for r in _since(connection, _SINCE_TRIALS_SQL, params)}
    found = {}
    # Each row made without the NamedTuples' per-row checks (as db.summary_rows): a status
    # without a kept tally reads every trial here
    make, read_flags = tuple.__new__, SummaryFlags.read
    for (trial_id, *row, verified, platform, mismatch, reason) in \
            _since(connection, _SINCE_SUMMARY_SQL, params) if has_summary else ():
        trial = trials.get(trial_id)
        if trial is not None:
            flags = read_flags((row[0], verified, platform, mismatch, reason)) \
                if verified is not None or mismatch or reason \
                else make(SummaryFlags, (row[0], None, platform, None, None))
            found[trial_id] = make(SinceTrial, (trial_id, make(TrialRow, row), flags, {}, trial[5],
                                                True))
    attrs: dict[int, dict[str, Any]] = {}
    if len(found) < len(trials):
        for trial_id, key, value in _since(connection, _SINCE_ATTRS_SQL,
                                           {**params, "keys": list(ATTR_KEYS)}):
            if int(trial_id) not in found:
                attrs.setdefault(int(trial_id), {})[key] = json.loads(value)
    for trial_id, (_, number, state, start, end, value, last_step) in trials.items():
        if trial_id not in found:
            a = attrs.get(trial_id, {})
            row, flags = from_attrs(int(number), state_name(state), start, end, last_step, a)
            found[trial_id] = make(SinceTrial, (trial_id, row, flags, a, value, False))
    return [found[t] for t in sorted(found)]


def summarize(connection: Readable, study_id: int, trials: list[SinceTrial]) -> None:
    """Summary rows for trials that ended outside the orchestrator, from their attrs (as the
    orchestrator writes one for its own), so the summary's indexes cover every folded trial;
    one batch (a run's first start on a study plain Optuna wrote summarizes all of it)."""
    if any(t.summarized for t in trials):
        raise ValueError("a trial has its summary row already")
    execute_many(connection, _SUMMARIZE_SQL, [
        SummaryRow.of(t.trial_id, study_id, t.row.number, t.row.state, t.attrs,
                      start_s=t.row.start_s, end_s=t.row.end_s, last_step=t.row.last_step).values()
        for t in trials])


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


def other_studies_busy(connection: Readable, study_id: int, host: str, gpu_index: int,
                       lo: float, hi: float) -> float:
    """Seconds within [lo, hi] that other studies' finished trials had GPU ``gpu_index`` of
    ``host``: the length of the union of their intervals, clipped to the window."""
    intervals = sorted(fetch_all(connection, _OTHER_STUDIES_ON_GPU_SQL,
                                 {"s": study_id, "h": host, "g": gpu_index, "lo": lo, "hi": hi}))
    busy, cursor = 0.0, lo
    for start, end in intervals:
        start, end = max(start, cursor), min(end, hi)
        if end > start:
            busy += end - start
            cursor = end
    return busy


def fail_attrs(connection: Readable, trial_ids: list[int]) -> dict[int, dict[str, Any]]:
    """number -> the failure attrs of those trials that have any (as db.fail_errors reads)."""
    found: dict[int, dict[str, Any]] = {}
    if trial_ids:
        for number, key, value in rows(connection, _FAIL_ATTRS_SQL, {"ids": list(trial_ids)}, ["ids"]):
            found.setdefault(int(number), {})[key] = json.loads(value)
    return found


_FINISHED = ("COMPLETE", "PRUNED", "FAIL")
_TEXT_LIMITS = (("host", 255), ("fail_reason", 32), ("opencl_platform", 255))  # db/tables.py


def advance(connection: Readable, study_id: int, study_name: str, rebuild: bool = False) -> None:
    """Fold the study's trials ended since the tally's watermark into it, within the caller's
    transaction: a trial's end, at most once a second, and the run's end
    (scheduler/_writes.py). A tally behind makes status read more trials, never a wrong
    count. Without a tally (a study of an older version), or one that cannot be kept exact,
    only ``rebuild`` (at a run's start: it reads every trial, once) makes one.

    Trials that ended elsewhere (optuna's CLI, a reaper, an older orchestrator) are folded in
    here too, and get the summary row the orchestrator would have written.
    """
    stored = read_tally(connection, study_id, for_update=True)
    tally = Tally.from_json(stored[1]) if stored is not None and stored[0] == VERSION else None
    if rebuild and (tally is None or not trusted(connection, study_id, study_name, tally)):
        tally = Tally(study_name=study_name)
    if tally is None or not tally.exact:
        return
    since = trials_since(connection, study_id, tally.watermark, tally.holes)
    top = max([tally.watermark, *(t.trial_id for t in since)])
    holes, hole_starts, unsummarized = [], [], []
    for trial in since:
        if trial.row.state not in _FINISHED:
            holes.append(trial.trial_id)
            if trial.row.start_s is not None:
                hole_starts.append(trial.row.start_s)
            continue
        if not trial.summarized and not _fits(trial):
            tally.exact = False  # no summary row can hold it: status folds every trial afresh
            continue
        if trial.row.start_s is not None and trial.row.end_s is None:
            tally.exact = False  # finished without an end: its interval would end "now"
        tally.add(trial.trial_id, trial.row, trial.value, now=math.nan)
        tally.folded += 1
        if not trial.summarized:
            unsummarized.append(trial)
    summarize(connection, study_id, unsummarized)
    if dialect(connection) == "postgresql":
        # Ids come from a sequence: one below ``top`` may belong to a trial whose insert has
        # not committed yet. Those that exist nowhere yet stay holes until they do.
        seen = {t.trial_id for t in since}
        exist = existing_ids(connection, tally.watermark, top, tally.holes)
        candidates = [*range(tally.watermark + 1, top + 1), *tally.holes]
        holes += sorted({i for i in candidates if i not in exist and i not in seen})
    tally.watermark, tally.holes = top, sorted(set(holes))
    tally.fold_before(hole_starts)
    write_tally(connection, study_id, VERSION, tally.to_json())


def trusted(connection: Readable, study_id: int, study_name: str, tally: Tally) -> bool:
    """Exact, of this study, and counting as many trials as there are summary rows up to its
    watermark, holes left out: rows deleted would make it wrong."""
    if not tally.exact or tally.study_name != study_name:
        return False
    upto, in_holes = summary_count_upto(connection, study_id, tally.watermark, tally.holes)
    return upto - in_holes == tally.folded


def _fits(trial: SinceTrial) -> bool:
    """Its attrs fit the summary's columns (another tool may have written anything there)."""
    values: dict[str, Any] = {"host": trial.row.host, "fail_reason": trial.flags.fail_reason,
                              "opencl_platform": trial.flags.opencl_platform}
    if any(v is not None and not isinstance(v, str) for v in values.values()):
        return False
    if any(values[k] is not None and len(values[k]) > n for k, n in _TEXT_LIMITS):
        return False
    gpu = trial.row.gpu_index
    return gpu is None or (isinstance(gpu, int) and not isinstance(gpu, bool))
