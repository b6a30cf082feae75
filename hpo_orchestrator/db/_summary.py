"""A finished trial's summary row (``hpo_trial_summary``, docs/DESIGN.md §2.4), in one place.

:class:`SummaryRow` is the row: the table's columns (db/tables.py), the column lists of the
statements that write and read it (tally/_tally.py, db/_trial_rows.py) and the row built from a
trial's ``hpo.*`` attrs (a trial that ended outside the orchestrator, or one the orchestrator
told: scheduler/_writes.py) all come from its fields. A new column is one field here, with
its ``hpo.*`` key when it mirrors an attr: nullable, so that a database written before it gets
it by ``ALTER TABLE ... ADD COLUMN`` at the next run's start (db/tables.ensure_tables), its
older rows NULL there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from hpo_orchestrator import keys

__all__ = ["FLAGGED_WHERE", "KINDS", "SUMMARY_ATTRS", "SUMMARY_COLUMNS", "SummaryRow", "copied_attrs"]

# A column's kind, as db/tables.py maps it to a SQLAlchemy type (not imported here: status
# --json on sqlite reads the summary through sqlite3 alone, db/_sql.py): "str" has a length.
KINDS = ("int", "float", "bool", "str", "json")


def _column(kind: str, attr: str | None = None, *, length: int | None = None,
            required: bool = False, **options: Any) -> Any:
    """A field that is a column of ``kind``; ``attr``: the ``hpo.*`` key it copies;
    ``options``: the SQLAlchemy Column's (a required field's: the key, NOT NULL, an index)."""
    metadata = {"kind": kind, "length": length, "attr": attr, "options": options}
    return field(metadata=metadata) if required else field(default=None, metadata=metadata)


@dataclass(frozen=True)
class SummaryRow:
    """One narrow row per finished trial, so ``status`` reads 100k trials in one scan. Optuna's
    tables stay the authority: each fact is also in Optuna's trial or its ``hpo.*`` attrs."""

    trial_id: int = _column("int", required=True, primary_key=True, autoincrement=False)
    study_id: int = _column("int", required=True, nullable=False, index=True)
    number: int = _column("int", required=True, nullable=False)
    state: str = _column("str", length=8, required=True, nullable=False)
    host: str | None = _column("str", keys.HOST, length=255)
    gpu_index: int | None = _column("int", keys.GPU_INDEX)  # NULL on a CPU slot
    start_s: float | None = _column("float")  # epoch seconds (spawn)
    end_s: float | None = _column("float")  # epoch seconds (told)
    startup_s: float | None = _column("float", keys.STARTUP_S)
    first_decision_s: float | None = _column("float", keys.FIRST_DECISION_S)
    last_step: int | None = _column("int")  # last reported (a PRUNED trial's pruning step)
    gpu_util_mean: float | None = _column("float", keys.GPU_UTIL_MEAN)
    gpu_util_compute_mean: float | None = _column("float", keys.GPU_UTIL_COMPUTE_MEAN)
    gpu_energy_j: float | None = _column("float", keys.GPU_ENERGY_J)
    gpu_verified: bool | None = _column("bool", keys.GPU_VERIFIED)
    fail_reason: str | None = _column("str", keys.FAIL_REASON, length=32)
    opencl_platform: str | None = _column("str", keys.OPENCL_PLATFORM, length=255)
    params_mismatch: str | None = _column("json", keys.PARAMS_MISMATCH)  # NULL when none

    @classmethod
    def of(cls, trial_id: int, study_id: int, number: int, state: str, attrs: dict[str, Any],
           *, start_s: float | None = None, end_s: float | None = None,
           last_step: int | None = None) -> SummaryRow:
        """The row of a trial whose ``hpo.*`` attrs are ``attrs`` (values of the wrong type
        read as NULL, as status would ignore them)."""
        return cls(trial_id, study_id, number, state, start_s=start_s, end_s=end_s,
                   last_step=last_step, **copied_attrs(attrs))

    def values(self) -> dict[str, Any]:
        """Column name -> value, as the INSERT binds them."""
        return {name: getattr(self, name) for name in SUMMARY_COLUMNS}


def copied_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """The columns that copy an ``hpo.*`` attr, from ``attrs`` (values of the wrong type read
    as NULL, as status would ignore them)."""
    if not attrs:  # plain Optuna's trials: a run's first start summarizes every one
        return dict.fromkeys(_COPIED_COLUMNS)
    return {name: _from_attr(kind, attrs.get(attr)) for name, attr, kind in _COPIED}


def _from_attr(kind: str, value: Any) -> Any:
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if isinstance(value, bool) or value is None:  # JSON true is no number
        return None
    if kind == "float":
        return float(value) if isinstance(value, (int, float)) else None
    if kind == "int":
        return value if isinstance(value, int) else None
    if kind == "json":  # of a dict or list; none when empty
        return json.dumps(value) if value else None
    return str(value) if value != "" else None


SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(SummaryRow))
# (column, hpo.* attr, kind) of the columns that copy an attr: read for a trial without a row
_COPIED: tuple[tuple[str, str, str], ...] = tuple(
    (f.name, f.metadata["attr"], f.metadata["kind"]) for f in fields(SummaryRow)
    if f.metadata["attr"] is not None)
SUMMARY_ATTRS: tuple[str, ...] = tuple(attr for _, attr, _ in _COPIED)
_COPIED_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in _COPIED)


# The flagged summary rows (GPU unused, params differ, a failure): the WHERE of a partial
# index (db/tables.py) and of the queries that use it (sqlite requires the same text).
FLAGGED_WHERE = "gpu_verified = false OR params_mismatch IS NOT NULL OR fail_reason IS NOT NULL"
