"""The reads every command starts with: which study, its direction and our study attrs, and
the one translation of database errors into a StorageError.

Values come back as Python values whatever the backend: states as 'COMPLETE' (PostgreSQL
stores the enum's text, sqlite the name), timestamps as naive UTC datetimes (sqlite hands
text() timestamps back as strings).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import keys
from hpo_orchestrator.db._sql import fetch_one, rows, scalar
from hpo_orchestrator.errors import ConfigError, HpoError, NoStudy, StorageError

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable

__all__ = ["UNREADABLE", "database_now", "list_studies", "read_errors", "state_name", "study_attrs",
           "study_config", "study_id_of", "to_datetime"]

_STUDIES_SQL = "SELECT study_name FROM studies ORDER BY study_id"
_STUDY_ID_SQL = "SELECT study_id FROM studies WHERE study_name = :n"
_STUDY_ATTRS_SQL = ("SELECT key, value_json FROM study_user_attributes WHERE study_id = :s "
                    "AND (key = 'hpo.config' OR key LIKE 'hpo.devices.%' "
                    "OR key LIKE 'hpo.packing.%' OR key LIKE 'hpo.device_choice.%' "
                    "OR key LIKE 'hpo.shared_cores.%' "
                    "OR key = 'hpo.pruner.min_resource_auto' OR key = 'hpo.pruner_history' "
                    "OR key = 'hpo.pruner_tuning')")
_NOW_SQL = "SELECT CURRENT_TIMESTAMP"
# The key of study_attrs()'s answer that lists the attrs of a shape we never write.
UNREADABLE = "unreadable attrs"  # not an attr of ours: those all start with "hpo."
_NOT_JSON = object()


@contextmanager
def read_errors() -> Iterator[None]:
    """Database errors while reading become one StorageError (the storage, not the user's
    input); the user's own errors (a wrong study name) pass through, and so does anything else:
    a bug in our code is not a storage problem, and the CLI says "unexpected ... report it"
    with its traceback under --debug."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        if not isinstance(exc, HpoError) and not _is_storage_error(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot read the storage: {first}",
                           "is it an Optuna database? (optuna trials --storage URL ...)") from exc


def _is_storage_error(exc: BaseException) -> bool:
    """SQLAlchemy's errors (drivers' are wrapped in them) and plain sqlite3's (status --json
    reads with sqlite3 alone: SQLAlchemy is looked up only if it was imported)."""
    if isinstance(exc, sqlite3.Error):
        return True
    sa_exc = sys.modules.get("sqlalchemy.exc")
    return sa_exc is not None and isinstance(exc, sa_exc.SQLAlchemyError)


def to_datetime(value: Any) -> datetime | None:
    """A naive UTC datetime from what the driver returned (a string on sqlite)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=None) if value.tzinfo else value
    return datetime.fromisoformat(str(value))


def to_epoch(value: Any) -> float | None:
    """Epoch seconds of what the driver returned for a naive datetime (as ``to_datetime``)."""
    moment = to_datetime(value)
    return None if moment is None else moment.timestamp()


def to_epochs(values: list[Any]) -> list[float | None]:
    """``to_epoch`` of each of a column's values: sqlite's text parsed without a call a value
    (a study without summary rows converts two a trial); another driver's datetimes, which
    fromisoformat refuses, one by one."""
    parse = datetime.fromisoformat
    try:
        return [None if v is None else parse(v).timestamp() for v in values]
    except TypeError:
        return [to_epoch(v) for v in values]


def state_name(value: Any) -> str:
    """'COMPLETE' on sqlite; PostgreSQL may hand back the TrialState enum's text."""
    return str(value).split(".")[-1]


def list_studies(connection: Readable) -> list[str]:
    return [row[0] for row in rows(connection, _STUDIES_SQL)]


def study_id_of(connection: Readable, study: str | None) -> tuple[int, str]:
    """(study_id, name) of ``study``, or of the only study when None; ConfigError otherwise."""
    names = list_studies(connection)
    if study is None:
        if len(names) == 1:
            study = names[0]
        elif names:
            raise ConfigError("the storage holds several studies",
                              f"pass --study NAME (studies: {', '.join(names)})")
        else:
            raise NoStudy("the storage holds no study", "pass --study NAME (studies: none)")
    row = fetch_one(connection, _STUDY_ID_SQL, {"n": study})
    if row is None:
        raise NoStudy(f"no study named {study!r}",
                          f"studies in this storage: {', '.join(names) or 'none'}")
    return int(row[0]), study


def study_attrs(connection: Readable, study_id: int) -> dict[str, Any]:
    """Our study attrs: hpo.config, hpo.devices.<host>, hpo.packing.<host>,
    hpo.device_choice.<host>, hpo.shared_cores.<host>, hpo.pruner.min_resource_auto, hpo.pruner_history and
    hpo.pruner_tuning, decoded. One of a shape we
    never write (written by someone else: not JSON, a string for a dict, ...) is left out and
    named under ``UNREADABLE``."""
    attrs: dict[str, Any] = {}
    unreadable = []
    for key, text in rows(connection, _STUDY_ATTRS_SQL, {"s": study_id}):
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            value = _NOT_JSON
        if value is _NOT_JSON or not keys.well_formed(key, value):
            unreadable.append(key)
        else:
            attrs[key] = value
    return {**attrs, UNREADABLE: sorted(unreadable)} if unreadable else attrs


def study_config(connection: Readable, study_id: int) -> dict[str, Any]:
    """The resolved config the study ran with (study attr hpo.config); {} when absent."""
    return study_attrs(connection, study_id).get(keys.CONFIG) or {}


def database_now(connection: Readable) -> datetime | None:
    """The database's clock: heartbeats are written with it, so their age is measured with it."""
    return to_datetime(scalar(connection, _NOW_SQL))
