"""The ``hpo_telemetry`` table: one row per sample per trial, beside Optuna's tables.

It lives in its own SQLAlchemy MetaData, so creating it never touches Optuna's schema (and
Optuna's migrations never see it). No foreign key to ``trials``: a sample row must never
block Optuna from deleting a study.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, DateTime, Float, Index, Integer, MetaData, String, Table
from sqlalchemy.engine import Engine

__all__ = ["TELEMETRY_COLUMNS", "ensure_table", "insert_samples", "telemetry_table"]

_metadata = MetaData()

telemetry_table = Table(
    "hpo_telemetry", _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("trial_id", Integer, nullable=False),
    Column("ts", DateTime, nullable=False),  # UTC, naive (as Optuna's own columns are naive)
    Column("gpu_index", Integer, nullable=True),  # NVML index; NULL on a CPU slot
    # The whole GPU, as nvidia-smi shows it (shared when trials_per_gpu > 1).
    Column("sm_util", Float),
    Column("mem_used_mib", Float),
    Column("power_w", Float),
    Column("temp_c", Float),
    Column("phase", String(64)),
    # This trial's processes only: what the driver attributes to them, and their CPU/RSS.
    Column("proc_sm_util", Float),
    Column("proc_mem_mib", Float),
    Column("cpu_util", Float),  # % of one core, summed over the process tree
    Column("rss_mib", Float),
    Index("ix_hpo_telemetry_trial_ts", "trial_id", "ts"),
)

TELEMETRY_COLUMNS = [c.name for c in telemetry_table.columns if c.name != "id"]


def ensure_table(engine: Engine) -> None:
    """Create ``hpo_telemetry`` (and its index) if missing; a no-op when it exists."""
    _metadata.create_all(engine, tables=[telemetry_table], checkfirst=True)


def insert_samples(engine: Engine, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        with engine.begin() as connection:
            connection.execute(telemetry_table.insert(), list(rows))
