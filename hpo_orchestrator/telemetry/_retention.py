"""Retention of ``hpo_telemetry``: old trials' samples averaged down to a bounded number of rows
(telemetry.keep_full_s, telemetry.max_rows_per_trial).

At 1 Hz a one-hour trial writes 3,600 rows per GPU, so a long study's table grows without
bound. A trial's samples stay at full resolution until it has been over for
``telemetry.keep_full_s``; then each of its GPUs (or its CPU series) is cut into at most
``max_rows`` buckets of consecutive samples, each replaced by one row: utilization, power
and CPU as means, memory and temperature as peaks, the most frequent phase, the first
timestamp. The trial's ``hpo.*`` aggregates were computed from every sample and never change.

The orchestrator's loop calls :meth:`TelemetryRetention.maybe_run` after writing samples; it
does a pass at most every ``keep_full_s / 2`` (between 1 s and 10 min), and one at the end of
the run. A pass looks only at this host's trials that ended since the last pass (a cursor on
their end time), at most _BATCH at a time, so its cost does not grow with the study.

A trial is downsampled once, in one transaction: its rows are read, deleted and the buckets
inserted; if another orchestrator deleted them first, the delete finds fewer rows and
:class:`RetentionRaced` makes the caller roll back.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from hpo_orchestrator.db import TELEMETRY_COLUMNS, rows, to_datetime
from hpo_orchestrator.db.tables import insert_samples

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["RetentionRaced", "TelemetryRetention", "downsample_trial", "retention_candidates"]

_BATCH = 200  # trials looked at per pass

_CANDIDATES_SQL = (
    "SELECT trial_id, end_s FROM hpo_trial_summary WHERE study_id = :s AND host = :h "
    "AND (end_s > :since OR (end_s = :since AND trial_id > :after)) AND end_s < :cutoff "
    "ORDER BY end_s, trial_id LIMIT :n")
_COUNTS_SQL = "SELECT COUNT(*) FROM hpo_telemetry WHERE trial_id = :t GROUP BY gpu_index"
_ROWS_SQL = "SELECT id, {columns} FROM hpo_telemetry WHERE trial_id = :t ORDER BY ts, id"
_DELETE_SQL = "DELETE FROM hpo_telemetry WHERE trial_id = :t AND id <= :last"

_MEAN = ("sm_util", "power_w", "proc_sm_util", "cpu_util")
_PEAK = ("mem_used_mib", "temp_c", "proc_mem_mib", "rss_mib")


class RetentionRaced(Exception):
    """Another orchestrator downsampled the trial first: roll the transaction back."""


def retention_candidates(connection: Connection, study_id: int, host: str, since: float,
                         cutoff: float, limit: int, after: int | None = None
                         ) -> list[tuple[int, float]]:
    """(trial_id, end_s) of this host's trials of the study that ended after the cursor
    (``since``, ``after``) and before ``cutoff``, oldest first (epoch seconds, from
    hpo_trial_summary). The cursor is the last (end_s, trial_id) looked at: trials that ended
    at the same time as the last of a batch are found by the next one (end_s alone skipped
    them for ever). Without ``after``, strictly after ``since``."""
    found = rows(connection, _CANDIDATES_SQL, {"s": study_id, "h": host, "since": since,
                                               "after": 2**62 if after is None else after,
                                               "cutoff": cutoff, "n": limit})
    return [(int(trial_id), float(end_s)) for trial_id, end_s in found]


def downsample_trial(connection: Connection, trial_id: int, max_rows: int) -> bool:
    """Bucket the trial's samples down to ``max_rows`` rows per GPU, within the caller's
    transaction. False when it has no more than that (nothing to do); RetentionRaced when
    another orchestrator got there first (the caller rolls back)."""
    counts = [n for (n,) in rows(connection, _COUNTS_SQL, {"t": trial_id})]
    if not counts or max(counts) <= max_rows:
        return False
    sql = _ROWS_SQL.format(columns=", ".join(TELEMETRY_COLUMNS))
    samples = [dict(zip(["id", *TELEMETRY_COLUMNS], row, strict=True))
               for row in rows(connection, sql, {"t": trial_id})]
    by_gpu: dict[Any, list[dict[str, Any]]] = {}
    for row in samples:
        by_gpu.setdefault(row["gpu_index"], []).append(row)
    buckets = []
    for series in by_gpu.values():
        size = math.ceil(len(series) / max_rows)
        buckets += [_bucket(series[i:i + size]) for i in range(0, len(series), size)]
    deleted = rows(connection, _DELETE_SQL,
                   {"t": trial_id, "last": max(r["id"] for r in samples)}).rowcount
    if deleted != len(samples):
        raise RetentionRaced(f"trial {trial_id}: {deleted} of {len(samples)} samples left")
    insert_samples(connection, buckets)
    return True


def _bucket(series: list[dict[str, Any]]) -> dict[str, Any]:
    first = series[0]
    out: dict[str, Any] = {"trial_id": first["trial_id"], "ts": to_datetime(first["ts"]),
                           "gpu_index": first["gpu_index"]}
    for column in _MEAN:
        values = [r[column] for r in series if r[column] is not None]
        out[column] = round(sum(values) / len(values), 2) if values else None
    for column in _PEAK:
        values = [r[column] for r in series if r[column] is not None]
        out[column] = max(values) if values else None
    phases = Counter(r["phase"] for r in series)
    out["phase"] = phases.most_common(1)[0][0]
    return out


class TelemetryRetention:
    def __init__(self, engine: Engine, study_id: int, host: str, keep_full_s: float,
                 max_rows: int) -> None:
        self.engine = engine
        self.study_id = study_id
        self.host = host
        self.keep_full_s = keep_full_s
        self.max_rows = max_rows
        self.every_s = min(600.0, max(1.0, keep_full_s / 2))
        self._since = 0.0  # end time (epoch s) of the last trial looked at
        self._since_id = -1  # and its id: trials that ended at the same time come after it
        self._ran_at = time.monotonic()
        self.downsampled = 0  # trials downsampled by this run

    def maybe_run(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._ran_at < self.every_s:
            return
        self._ran_at = now
        cutoff = time.time() - self.keep_full_s
        with self.engine.connect() as connection:
            trials = retention_candidates(connection, self.study_id, self.host, self._since,
                                          cutoff, _BATCH, after=self._since_id)
        for trial_id, end_s in trials:
            try:
                with self.engine.begin() as connection:
                    self.downsampled += downsample_trial(connection, trial_id, self.max_rows)
            except RetentionRaced:
                pass  # another orchestrator did it (rolled back here)
            self._since, self._since_id = end_s, trial_id
