"""Running the package's statements on a SQLAlchemy connection or on a plain ``sqlite3`` one.

``status --json`` on a sqlite file reads through ``sqlite3`` alone: importing SQLAlchemy costs
0.25-0.37 s on the 2-core VM, more than the whole read of a study with a kept tally
(docs/BENCHMARKS.md "status from a kept tally"). The statements are the same text either way:
sqlite3 takes ``:name`` parameters as SQLAlchemy's ``text()`` does; the one difference,
``IN :name`` with a list, is expanded here. Modules that use these helpers import SQLAlchemy
only when a SQLAlchemy connection is handed to them: every statement of the package runs
through them, so that the db package's face imports no SQLAlchemy (the tables and the engines,
which are SQLAlchemy's, are the public modules db/tables.py and db/connect.py).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    from sqlalchemy.engine import Connection

    Readable: TypeAlias = Connection | sqlite3.Connection  # what the package's readers take

__all__ = ["dialect", "execute_many", "fetch_all", "fetch_one", "has_table", "rows", "scalar"]

_TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table'"


def dialect(connection: Readable) -> str:
    return "sqlite" if isinstance(connection, sqlite3.Connection) else connection.dialect.name


def rows(connection: Readable, sql: str, params: dict[str, Any] | None = None,
         expanding: Sequence[str] = (), datetimes: Sequence[str] = ()) -> Any:
    """The rows of ``sql`` (iterable; fetchone/fetchall). ``expanding``: the parameters that
    hold lists, for ``IN :name``; ``datetimes``: those compared with or written into a
    DateTime column as SQLAlchemy stores it (sqlite: text with microseconds, as Optuna's own
    rows), where a plain bind would differ."""
    params = dict(params or {})
    if isinstance(connection, sqlite3.Connection):
        for name in datetimes:
            params[name] = _sqlite_datetime(params[name])
        for name in expanding:
            values = list(params.pop(name))
            keys = [f"{name}_{i}" for i in range(len(values))]
            params.update(zip(keys, values, strict=True))
            # an empty list matches nothing, as SQLAlchemy's expansion does
            listed = ", ".join(f":{k}" for k in keys) if keys else "SELECT NULL WHERE 1 = 0"
            sql = re.sub(rf"IN :{name}\b", f"IN ({listed})", sql)
        return connection.execute(sql, params)
    return connection.execute(_statement(sql, expanding, datetimes), params)


def execute_many(connection: Readable, sql: str, params: Sequence[Mapping[str, Any]],
                 datetimes: Sequence[str] = ()) -> None:
    """``sql`` once for each of ``params`` (a batch of rows written); nothing when empty."""
    if not params:
        return
    connection = _driver(connection)
    if isinstance(connection, sqlite3.Connection):
        connection.executemany(sql, [{**p, **{n: _sqlite_datetime(p[n]) for n in datetimes}}
                                     for p in params])
        return
    connection.execute(_statement(sql, (), datetimes), [dict(p) for p in params])


def _driver(connection: Readable) -> Readable:
    """sqlite's own connection under a SQLAlchemy one, in its transaction: SQLAlchemy's rows
    and per-row parameters cost more than sqlite's work when there are many (a status without
    a kept tally reads every trial; a run's first start summarizes every trial)."""
    if not isinstance(connection, sqlite3.Connection) and connection.dialect.name == "sqlite":
        driver = connection.connection.driver_connection
        if isinstance(driver, sqlite3.Connection):
            return driver
    return connection


def _statement(sql: str, expanding: Sequence[str], datetimes: Sequence[str]) -> Any:
    from sqlalchemy import DateTime, bindparam, text

    statement = text(sql)
    for name in expanding:
        statement = statement.bindparams(bindparam(name, expanding=True))
    for name in datetimes:
        statement = statement.bindparams(bindparam(name, type_=DateTime()))
    return statement


def _sqlite_datetime(value: datetime | None) -> str | None:
    """A datetime as SQLAlchemy's DateTime stores it in sqlite."""
    return None if value is None else value.strftime("%Y-%m-%d %H:%M:%S.%f")


def fetch_one(connection: Readable, sql: str, params: dict[str, Any] | None = None,
              expanding: Sequence[str] = (), datetimes: Sequence[str] = ()) -> Any:
    return rows(connection, sql, params, expanding, datetimes).fetchone()


def fetch_all(connection: Readable, sql: str, params: dict[str, Any] | None = None,
              expanding: Sequence[str] = (), datetimes: Sequence[str] = ()) -> list[Any]:
    """Every row of ``sql``, as tuples; on sqlite through the driver's own cursor (_driver)."""
    return list(rows(_driver(connection), sql, params, expanding, datetimes).fetchall())


def scalar(connection: Readable, sql: str, params: dict[str, Any] | None = None,
           expanding: Sequence[str] = (), datetimes: Sequence[str] = ()) -> Any:
    row = fetch_one(connection, sql, params, expanding, datetimes)
    return None if row is None else row[0]


def has_table(connection: Readable, name: str) -> bool:
    if isinstance(connection, sqlite3.Connection):
        return name in {row[0] for row in connection.execute(_TABLES_SQL)}
    from sqlalchemy import inspect

    return bool(inspect(connection).has_table(name))
