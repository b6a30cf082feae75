"""Opening a plain ``sqlite:///PATH`` study with ``sqlite3`` alone, read-only and checked; and
what a sqlite file that cannot be written means to its readers and to a run.

Apart from db/_sql.py (the statements' runner) because the check at open needs the schema
revision (db/_version.py), which itself reads through db/_sql.py: one direction, no circle.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from hpo_orchestrator.db._sql import has_table
from hpo_orchestrator.db._version import check_schema
from hpo_orchestrator.errors import StorageError

__all__ = ["only_immutable", "open_sqlite", "read_only_error", "read_only_reason"]


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


def read_only_reason(path: Path) -> str | None:
    """Why sqlite cannot write the database file ``path``, or None: a read-only file system,
    or a file or folder this user cannot write (sqlite writes its journal, or its -wal and
    -shm files, beside the database)."""
    try:
        if os.statvfs(path.parent).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError:
        return None
    if path.exists() and not os.access(path, os.W_OK):
        return "this user cannot write the file"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"this user cannot write its folder {path.parent} (sqlite writes its journal there)"
    return None


def read_only_error(path: Path, reason: str) -> StorageError:
    copy = Path.home() / path.name
    return StorageError(f"{path} is read-only: {reason}",
                        f"a run writes its trials there: make it writable, or copy it where you "
                        f"can write (cp {path} {copy}) and run with storage.url=sqlite:///{copy}; "
                        f"status and report read it as it is")


def only_immutable(exc: sqlite3.OperationalError) -> bool:
    """Did ``mode=ro`` fail on a WAL database for want of its -shm file, which a read-only
    place cannot hold? (sqlite: "unable to open database file" on a read-only mount, "attempt
    to write a readonly database" in a folder this user cannot write.)"""
    return "unable to open" in str(exc) or "readonly database" in str(exc)
