"""Retention of ``hpo_telemetry``: old trials' samples averaged down to a bounded number of rows.

At 1 Hz a one-hour trial writes 3,600 rows per GPU, so a long study's table grows without
bound. A trial's samples stay at full resolution until it has been over for
``telemetry.keep_full_s``; then each of its GPUs (or its CPU series) is cut into at most
``max_rows`` buckets of consecutive samples, each replaced by one row: utilization, power
and CPU as means, memory and temperature as peaks, the most frequent phase, the first
timestamp. The trial's ``hpo.*`` aggregates were computed from every sample and never change.

A trial is downsampled once, in one transaction: its rows are read, deleted and the buckets
inserted; if another orchestrator deleted them first, the delete finds fewer rows and
:class:`RetentionRaced` makes the caller roll back.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._schema import TELEMETRY_COLUMNS, telemetry_table
from hpo_orchestrator.db._study import to_datetime

__all__ = ["RetentionRaced", "downsample_trial", "retention_candidates"]

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
    rows = connection.execute(text(_CANDIDATES_SQL), {"s": study_id, "h": host, "since": since,
                                                      "after": 2**62 if after is None else after,
                                                      "cutoff": cutoff,
                                                      "n": limit})
    return [(int(trial_id), float(end_s)) for trial_id, end_s in rows]


def downsample_trial(connection: Connection, trial_id: int, max_rows: int) -> bool:
    """Bucket the trial's samples down to ``max_rows`` rows per GPU, within the caller's
    transaction. False when it has no more than that (nothing to do); RetentionRaced when
    another orchestrator got there first (the caller rolls back)."""
    counts = [n for (n,) in connection.execute(text(_COUNTS_SQL), {"t": trial_id})]
    if not counts or max(counts) <= max_rows:
        return False
    sql = _ROWS_SQL.format(columns=", ".join(TELEMETRY_COLUMNS))
    rows = [dict(zip(["id", *TELEMETRY_COLUMNS], row, strict=True))
            for row in connection.execute(text(sql), {"t": trial_id})]
    by_gpu: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        by_gpu.setdefault(row["gpu_index"], []).append(row)
    buckets = []
    for series in by_gpu.values():
        size = math.ceil(len(series) / max_rows)
        buckets += [_bucket(series[i:i + size]) for i in range(0, len(series), size)]
    deleted = connection.execute(text(_DELETE_SQL),
                                 {"t": trial_id, "last": max(r["id"] for r in rows)}).rowcount
    if deleted != len(rows):
        raise RetentionRaced(f"trial {trial_id}: {deleted} of {len(rows)} samples left")
    connection.execute(telemetry_table.insert(), buckets)
    return True


def _bucket(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    out: dict[str, Any] = {"trial_id": first["trial_id"], "ts": to_datetime(first["ts"]),
                           "gpu_index": first["gpu_index"]}
    for column in _MEAN:
        values = [r[column] for r in rows if r[column] is not None]
        out[column] = round(sum(values) / len(values), 2) if values else None
    for column in _PEAK:
        values = [r[column] for r in rows if r[column] is not None]
        out[column] = max(values) if values else None
    phases = Counter(r["phase"] for r in rows)
    out["phase"] = phases.most_common(1)[0][0]
    return out
