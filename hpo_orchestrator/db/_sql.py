"""Running the package's statements on a SQLAlchemy connection or on a plain ``sqlite3`` one.

``status --json`` on a sqlite file reads through ``sqlite3`` alone: importing SQLAlchemy costs
0.25-0.37 s on the 2-core VM, more than the whole read of a study with a kept tally
(docs/BENCHMARKS.md "status from a kept tally"). The statements are the same text either way:
sqlite3 takes ``:name`` parameters as SQLAlchemy's ``text()`` does; the one difference,
``IN :name`` with a list, is expanded here. Modules that use these helpers import SQLAlchemy
only when a SQLAlchemy connection is handed to them.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    from sqlalchemy.engine import Connection

    Readable: TypeAlias = Connection | sqlite3.Connection  # what the package's readers take

__all__ = ["dialect", "fetch_all", "fetch_one", "has_table", "rows", "scalar"]

_TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table'"


def dialect(connection: Readable) -> str:
    return "sqlite" if isinstance(connection, sqlite3.Connection) else connection.dialect.name


def rows(connection: Readable, sql: str, params: dict[str, Any] | None = None,
         expanding: Sequence[str] = ()) -> Any:
    """The rows of ``sql`` (iterable; fetchone/fetchall). ``expanding``: the parameters that
    hold lists, for ``IN :name``."""
    params = dict(params or {})
    if isinstance(connection, sqlite3.Connection):
        for name in expanding:
            values = list(params.pop(name))
            keys = [f"{name}_{i}" for i in range(len(values))]
            params.update(zip(keys, values, strict=True))
            # an empty list matches nothing, as SQLAlchemy's expansion does
            listed = ", ".join(f":{k}" for k in keys) if keys else "SELECT NULL WHERE 1 = 0"
            sql = re.sub(rf"IN :{name}\b", f"IN ({listed})", sql)
        return connection.execute(sql, params)
    from sqlalchemy import bindparam, text

    statement = text(sql)
    for name in expanding:
        statement = statement.bindparams(bindparam(name, expanding=True))
    return connection.execute(statement, params)


def fetch_one(connection: Readable, sql: str,
              params: dict[str, Any] | None = None, expanding: Sequence[str] = ()) -> Any:
    return rows(connection, sql, params, expanding).fetchone()


def fetch_all(connection: Readable, sql: str,
              params: dict[str, Any] | None = None, expanding: Sequence[str] = ()) -> list[Any]:
    return list(rows(connection, sql, params, expanding).fetchall())


def scalar(connection: Readable, sql: str,
           params: dict[str, Any] | None = None, expanding: Sequence[str] = ()) -> Any:
    row = fetch_one(connection, sql, params, expanding)
    return None if row is None else row[0]


def has_table(connection: Readable, name: str) -> bool:
    if isinstance(connection, sqlite3.Connection):
        return name in {row[0] for row in connection.execute(_TABLES_SQL)}
    from sqlalchemy import inspect

    return bool(inspect(connection).has_table(name))
