"""Moved to :mod:`hpo_orchestrator.db` (issue 13); these names stay importable from here until
the orchestrator being split in parallel (scheduler/, cli ``run``) and the benchmarks
import them from there."""

from __future__ import annotations

from hpo_orchestrator.db import ensure_tables, insert_samples, insert_summary, summary_table

__all__ = ["ensure_tables", "insert_samples", "insert_summary", "summary_table"]
