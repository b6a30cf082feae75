"""Moved to :mod:`hpo_orchestrator.db` (issue 13); these names stay importable from here until
the orchestrator being split in parallel (scheduler/, cli ``run``) imports them from there."""

from __future__ import annotations

from hpo_orchestrator.db import create_engine, mask_url, open_rdb_storage, setup_lock, sqlite_path

__all__ = ["create_engine", "mask_url", "open_rdb_storage", "setup_lock", "sqlite_path"]
