"""Opening a plain ``sqlite:///PATH`` study with ``sqlite3`` alone, read-only and checked.

Apart from db/_sql.py (the statements' runner) because the check at open needs the schema
revision (db/_version.py), which itself reads through db/_sql.py: one direction, no circle.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hpo_orchestrator.db._sql import has_table
from hpo_orchestrator.db._version import check_schema

__all__ = ["open_sqlite"]


def open_sqlite(url: str) -> sqlite3.Connection | None:
    """A read-only sqlite3 connection to the Optuna database of a plain ``sqlite:///PATH`` URL,
    checked as db.connect.create_engine checks it (the schema revision: StorageError); None for any
    other URL or anything unusual (no file, no studies, a file only readable as immutable):
    the caller opens it with create_engine, which says what is wrong."""
    if not url.startswith("sqlite:///") or "?" in url or url == "sqlite:///:memory:":
        return None
    path = Path(url.removeprefix("sqlite:///"))
    if not path.is_file():
        return None
    try:
        connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True,
                                     timeout=60.0, isolation_level=None)
        if not has_table(connection, "studies") or not check_schema(connection, url):
            connection.close()
            return None
    except sqlite3.Error:
        return None
    return connection
