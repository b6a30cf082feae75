"""Opening the Optuna RDB with SQLAlchemy: URL checks, secret masking, sqlite made safe for a
long run, the locks that serialize orchestrators, and the schema-version check (db/_version.py)
at open.

A public module of db/, apart from the package's face: it imports SQLAlchemy, which the face
does not (``status --json`` on sqlite reads through ``sqlite3`` alone: db/_sql.py). Every
command that opens an engine imports it by name.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy
from sqlalchemy import event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from hpo_orchestrator.db._sqlite import only_immutable, read_only_error, read_only_reason
from hpo_orchestrator.db._version import check_schema
from hpo_orchestrator.errors import SECRET_QUERY_KEYS, NoDatabase, StorageError, mask_passwords

if TYPE_CHECKING:  # status and telemetry read with SQLAlchemy only: keep optuna's import off them
    import optuna

__all__ = ["ADVISORY_NAMESPACE", "check_url", "create_engine", "file_lock", "lock_file", "mask_url",
           "mask_url_in", "open_rdb_storage", "paste_url", "setup_lock", "sqlite_path",
           "validated_path"]

# Keeps our PostgreSQL advisory lock keys apart from other applications' ("hp").
ADVISORY_NAMESPACE = 0x6870

_SQLITE_BUSY_TIMEOUT_S = 60.0
_SQLITE_TABLES_SQL = "SELECT name FROM sqlite_master WHERE type='table'"
_ADVISORY_LOCK_SQL = "SELECT pg_advisory_lock(:ns, 0)"
_ADVISORY_UNLOCK_SQL = "SELECT pg_advisory_unlock(:ns, 0)"


def mask_url(url: str) -> str:
    """The URL with any password (``user:pw@``, and the query's ``password``, ``sslpassword``,
    ``passfile``) replaced by ***: the one helper for every message a user may see and for the
    study attr hpo.config."""
    try:
        # SQLAlchemy ends the password at the first '@': an unescaped one leaves the rest
        return mask_passwords(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        return "<unparseable storage URL>"


def sqlite_path(url: str) -> Path | None:
    """The database file of a sqlite URL (None for other backends or in-memory sqlite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _tables_of(path: Path) -> set[str]:
    """The tables of the sqlite file; a WAL database that cannot be written (a read-only
    mount, no write permission) opens only as ``immutable``: its -shm file cannot be made."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            return {row[0] for row in connection.execute(_SQLITE_TABLES_SQL)}
    except sqlite3.OperationalError as exc:
        if not only_immutable(exc):
            raise
    with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as connection:
        return {row[0] for row in connection.execute(_SQLITE_TABLES_SQL)}


def _check_sqlite_file(path: Path, create: bool) -> None:
    try:
        exists = path.exists()
    except PermissionError:  # a folder on the way that this user may not enter
        raise StorageError(f"cannot read {path}: permission denied",
                           "check the permissions of the file and its folders") from None
    if not exists:
        if not create:
            raise NoDatabase(f"no database at {path}", "run a study first, or pass --storage URL")
        if not path.parent.is_dir():
            raise StorageError(f"folder {path.parent} does not exist",
                               "create it or choose another storage.url")
        read_only = read_only_reason(path)
        if read_only is not None:
            raise StorageError(f"cannot create {path}: {read_only}",
                               "choose a folder this user can write for storage.url")
        return
    try:
        tables = _tables_of(path)
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"{path} is not a sqlite database ({exc})",
                           "point storage.url at an Optuna database or a new file") from None
    if tables and "studies" not in tables:
        raise StorageError(f"{path} is a sqlite database but not an Optuna one",
                           "point storage.url at an Optuna database or a new file")
    read_only = read_only_reason(path) if create else None
    if read_only is not None:
        raise read_only_error(path, read_only)


def _tune_sqlite(engine: Engine, read_only: bool = False) -> None:
    """WAL + busy timeout + synchronous=NORMAL on every connection (a reader: the busy
    timeout only: WAL would be written into the file).

    WAL lets readers (the sqlite3 shell, a dashboard, `status`) read while the orchestrator
    writes; the busy timeout makes a writer wait instead of failing with 'database is locked'.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_TIMEOUT_S * 1000)}")
        if not read_only:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


def create_engine(url: str, read_only: bool = True) -> Engine:
    """A SQLAlchemy engine for the readers (status, report, telemetry, tune-pruner).

    Read-only (the default) changes nothing, so a read command may look at any database: a
    sqlite file is opened with ``mode=ro`` (its journal mode stays, a file the user can only
    read is readable, a missing one is exit 2, never created); PostgreSQL sessions are
    ``default_transaction_read_only``. The file (sqlite) and the Optuna schema version are
    checked here, once, so a database our SQL does not know fails with a hint before any
    command reads it. ``read_only=False``: a writer (tests of the db package).
    """
    path = validated_path(url, create=False)
    if path is not None and read_only:
        engine = sqlalchemy.create_engine(_sqlite_read_only_url(path))
        _tune_sqlite(engine, read_only=True)
    elif path is not None:
        engine = sqlalchemy.create_engine(url)
        _tune_sqlite(engine)
    elif read_only and make_url(url).get_backend_name() == "postgresql":
        engine = _create_or_refuse(url, connect_args={
            "options": "-c default_transaction_read_only=on"})
    else:
        engine = _create_or_refuse(url)
    _check_schema_of(engine, url)
    if read_only:
        _require_studies(engine, url)
    return engine


def _create_or_refuse(url: str, **kwargs: object) -> Engine:
    """An engine, or exit 2 when the URL names a dialect or driver that is not there."""
    try:
        return sqlalchemy.create_engine(url, **kwargs)  # type: ignore[arg-type]
    except (ImportError, ArgumentError, ValueError) as exc:
        raise _open_error(exc, url) from None


def _sqlite_read_only_url(path: Path) -> str:
    """``mode=ro`` opens without writing; a WAL database whose -shm file is missing in a place
    the user cannot write (a read-only mount, a folder without write permission) is only
    readable as ``immutable`` (nobody can be writing it then: a writer would have created the
    file)."""
    uri = path.absolute().as_uri()
    try:
        with sqlite3.connect(f"{uri}?mode=ro", uri=True) as probe:
            probe.execute(_SQLITE_TABLES_SQL).fetchall()
    except sqlite3.OperationalError as exc:
        if not only_immutable(exc):
            raise StorageError(f"cannot read {path}: {exc}",
                               "check that the file is a database this user can read") from None
        return f"sqlite:///{uri}?mode=ro&immutable=1&uri=true"
    return f"sqlite:///{uri}?mode=ro&uri=true"


def _require_studies(engine: Engine, url: str) -> None:
    """A reader has nothing to read in a database without Optuna's tables (an empty file)."""
    try:
        with engine.connect() as connection:
            if inspect(connection).has_table("studies"):
                return
    except SQLAlchemyError as exc:
        raise _open_error(exc, url) from None
    raise NoDatabase(f"{mask_url(url)} holds no study yet",
                       "run a study first (hpo-orchestrator run), or pass --storage URL")


def _check_schema_of(engine: Engine, url: str) -> bool:
    try:
        with engine.connect() as connection:
            return check_schema(connection, mask_url(url))
    except SQLAlchemyError as exc:
        raise _open_error(exc, url) from None


_DAMAGED = ("malformed", "file is not a database", "not a database")


def _open_error(exc: Exception, url: str) -> StorageError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    path = sqlite_path(url)
    if path is None:
        hint = "check the URL, that the server is up, and the credentials"
    elif any(word in reason.lower() for word in _DAMAGED):
        hint = (f"the file is damaged (copied while a run wrote it, a full disk, a crash): "
                f"sqlite3 {path} 'PRAGMA integrity_check' says where; restore a copy, or use "
                f"another file")
    else:
        hint = f"check that {path} is an Optuna database this user can read"
    return StorageError(f"cannot open storage {mask_url(url)}: {mask_url_in(reason, url)}", hint)


def _check_driver(url: str) -> None:
    """The URL's dialect and its driver load, so a wrong name or a missing package is the
    user's error (exit 2) before anything is created, not an ImportError mid-start."""
    parsed = make_url(url)
    try:
        parsed.get_dialect().import_dbapi()
    except NoSuchModuleError:
        raise StorageError(f"storage URL {mask_url(url)!r}: SQLAlchemy has no dialect or driver "
                           f"{parsed.drivername!r}",
                           "e.g. sqlite:///hpo.db, postgresql+psycopg://user@host/db or "
                           "mysql+pymysql://user@host/db") from None
    except ImportError as exc:
        raise StorageError(f"storage URL {mask_url(url)!r}: the driver of {parsed.drivername!r} "
                           f"is not installed ({exc})",
                           "install it into this environment, or name an installed driver "
                           "(e.g. mysql+pymysql://, postgresql+psycopg://)") from None


def _password_holds_at(url: str) -> bool:
    """``user:pw@`` followed by another '@' before the query's first '=': an unescaped '@' in
    the password, whatever follows it ('/', '?' or ':' made SQLAlchemy read the password's
    tail as the host, the path or a port)."""
    _, scheme, rest = url.partition("://")
    userinfo, at, after = rest.partition("@")
    if not scheme or not at or rest.startswith("/") or ":" not in userinfo:
        return False
    return "@" in after.split("=", 1)[0]


def check_url(url: str) -> Path | None:
    """The URL parses, its driver loads and it is not an in-memory sqlite database (StorageError,
    exit 2, otherwise); its sqlite file, if any. Nothing is opened or created: callers check the
    URL before they derive folders from it (the run folder, the artifact store)."""
    at_in_password = StorageError(f"storage URL {mask_passwords(url)!r}: its password holds an '@'",
                                  "write each '@' in the password as %40 (URL-encoded)")
    if _password_holds_at(url):  # before parsing: its tail may read as a port
        raise at_in_password
    try:
        path = sqlite_path(url)
        _check_driver(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        reason = "the port is not a number" if isinstance(exc, ValueError) else str(exc)
        raise StorageError(f"cannot parse storage URL {mask_passwords(url)!r}: {reason}",
                           "e.g. sqlite:///hpo.db or postgresql+psycopg://user@host:5432/db") from None
    if "@" in (make_url(url).host or ""):
        # SQLAlchemy ends the password at its first '@' and takes the rest for the host: the
        # driver's "cannot resolve host" would quote the password's tail
        raise at_in_password
    if path is None and make_url(url).get_backend_name() == "sqlite":
        # each connection would get a database of its own, gone when the run ends
        raise StorageError(f"{mask_url(url)} is an in-memory sqlite database: the study would "
                           "be gone when the run ends", "use a file, e.g. sqlite:///hpo.db")
    return path


def validated_path(url: str, create: bool) -> Path | None:
    """A sqlite URL's file (None for a server), checked as opening it would check it: a bad
    URL, a missing folder, a file that is no Optuna database are the user's errors."""
    path = check_url(url)
    if path is not None:
        _check_sqlite_file(path, create)
    return path


def open_rdb_storage(url: str, heartbeat_interval_s: int | None = None,
                     grace_period_s: int | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage, creating the database (and its tables) if needed."""
    import optuna

    path = validated_path(url, create=True)
    current = False  # the database has the schema we know: Optuna need not create or check it
    if path is None or path.exists():  # Optuna would refuse an old schema with a RuntimeError (exit 1)
        timeout = {"connect_args": {"timeout": _SQLITE_BUSY_TIMEOUT_S}} if path is not None else {}
        probe = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, **timeout)
        try:
            current = _check_schema_of(probe, url)
        finally:
            probe.dispose()
    engine_kwargs: dict[str, object] = {}
    if path is not None:
        # Set WAL before Optuna's first connection creates the tables; it persists in the file.
        with sqlite3.connect(path, timeout=_SQLITE_BUSY_TIMEOUT_S) as connection:
            connection.execute("PRAGMA journal_mode=WAL")
        engine_kwargs["connect_args"] = {"timeout": _SQLITE_BUSY_TIMEOUT_S}
    else:
        engine_kwargs["pool_pre_ping"] = True
    try:
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval_s,
            grace_period=grace_period_s, skip_table_creation=current,
            skip_compatibility_check=current)  # each a round of schema queries per start
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise _open_error(exc, url) from None
    if path is not None:
        storage.engine.dispose()  # later connections get the pragmas from the listener
        _tune_sqlite(storage.engine)
    return storage


def mask_url_in(text: str, url: str) -> str:
    """``text`` with the URL's password and secret query values, if any, replaced by ***
    where they stand in a URL or a ``key=value`` pair (a driver's message may quote the
    conninfo), never wherever their text occurs (docs/CONFIGURATION.md, "Passwords")."""
    return mask_passwords(text, [url])


def paste_url(url: str) -> tuple[str, str | None]:
    """``url`` without its secrets, for a command the user pastes, and what supplies them
    instead (None when the URL has none). PostgreSQL's libpq drivers read a password left out
    of the URL from PGPASSWORD or ~/.pgpass (PGPASSFILE names another file), so the pasted
    command connects; other backends take it typed back in place of ***."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return mask_url(url), None
    if not _secrets_of(parsed):
        return url, None
    # an unescaped '@' in the password: SQLAlchemy took the rest of it for the host
    if parsed.get_backend_name() != "postgresql" or "@" in (parsed.host or ""):
        return mask_url(url), "type the password back in place of ***"
    keys = [key for key in parsed.query if key.lower() in SECRET_QUERY_KEYS]
    bare = parsed._replace(password=None).difference_update_query(keys)  # set() skips None
    return (bare.render_as_string(hide_password=False),
            "the password is not shown: export PGPASSWORD=... (or put it in ~/.pgpass; "
            "PGPASSFILE=path for passfile) before these commands")


def _secrets_of(parsed: sqlalchemy.engine.URL) -> list[str]:
    found = [str(parsed.password)] if parsed.password else []
    for key, value in parsed.query.items():
        if key.lower() in SECRET_QUERY_KEYS:
            found += [v for v in ([value] if isinstance(value, str) else value) if v]
    return found


def lock_file(path: Path) -> Path:
    """The file whose flock serializes the orchestrators of one sqlite database: in the run
    folder beside it (``hpo-runs/``, whose ``.gitignore`` keeps it out of ``git status``),
    created here if missing."""
    folder = path.parent / "hpo-runs"
    folder.mkdir(exist_ok=True)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by hpo-orchestrator: trial logs and lock files\n*\n")
    return folder / f".{path.name}.lock"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` (created if missing); the kernel drops it if we die."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def setup_lock(url: str) -> Iterator[None]:
    """Held while an orchestrator creates or upgrades the schema and the study.

    Two orchestrators starting together on a new database would otherwise both create
    Optuna's tables (alembic_version's unique key fails the second) or ours.
    """
    path = validated_path(url, create=True)  # a bad URL or folder is the user's error first
    if path is not None:
        with file_lock(lock_file(path)):
            yield
        return
    if make_url(url).get_backend_name() != "postgresql":
        yield
        return
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(_ADVISORY_LOCK_SQL), {"ns": ADVISORY_NAMESPACE})
            connection.commit()
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text(_ADVISORY_UNLOCK_SQL), {"ns": ADVISORY_NAMESPACE})
                connection.commit()
    except SQLAlchemyError as exc:
        raise _open_error(exc, url) from None
    finally:
        engine.dispose()
