"""Storage trouble during a run: what it is, how long to wait it out, and what to say.

A sqlite lock held past the busy timeout, a PostgreSQL connection terminated or a server
failing over are transient: the orchestrator retries the failed step with backoff (and a new
connection: PostgreSQL engines ping before each checkout) for ``storage.retry_s``. Only then,
or at once for a full disk or a read-only sqlite file, the run stops with exit 1 and a hint
that names the cause: a lock is not the objective's ``exception``, and a dropped connection
is not a full disk.

What is retried: each call the run makes on its study's storage (study/_storage.py's
``MirrorStorage``: ask, tell, heartbeats, the trial proxy's calls; its methods are declared
:func:`retried`, and Optuna's RDBStorage calls they make are retried with them), and each
transaction of ours (:meth:`Retrying.call`). A step whose
commit reached the server but whose answer was lost may run twice: harmless for writes of
attrs and values; an ask's retry first looks for the trial its earlier try created (started
at the same instant, with this orchestrator's host and pid: db/_run_io.py's
``ask_running_trial``) and takes it, where a second trial would be reaped as ``lost`` after
the grace period and stay a FAIL in the study.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hpo_orchestrator.errors import RuntimeFailure

__all__ = ["Retrying", "StorageUnavailable", "first_line", "is_retried", "retried",
           "retrying_of", "trouble_of"]

T = TypeVar("T")
_log = logging.getLogger("hpo_orchestrator")
_BACKOFF_FIRST_S = 0.2
_BACKOFF_MAX_S = 5.0

# Causes, from what the drivers say (lowercase message fragments; PostgreSQL SQLSTATEs).
_LOCKED = ("database is locked", "database table is locked", "lock timeout", "deadlock detected",
           "could not serialize", "lock not available", "could not obtain lock")
_DISK_FULL = ("database or disk is full", "no space left", "could not extend file", "disk full")
_READ_ONLY = ("readonly database", "read-only transaction", "read only transaction")
_CONNECTION = ("server closed the connection", "terminating connection", "connection refused",
               "could not connect", "connection is closed", "connection reset", "broken pipe",
               "consuming input failed", "connection timed out", "the database system is",
               "ssl connection has been closed", "no connection to the server",
               "connection already closed", "server conn crashed", "lost connection")
_SQLSTATE = {"40001": "locked", "40P01": "locked", "55P03": "locked", "53100": "disk full",
             "25006": "read-only", "57P01": "connection lost", "57P02": "connection lost",
             "57P03": "connection lost"}

_HINTS = {
    "locked": "another process holds a write lock on the database (a sqlite3 shell or a "
              "dashboard in an open transaction?): end it, or raise storage.retry_s",
    "connection lost": "the database server went away (restart, failover, network): check that "
                       "it is up and reachable, or raise storage.retry_s",
    "disk full": "free disk space on the database's volume",
    "read-only": "the database is read-only (file or folder permissions, a read-only mount, a "
                 "server in recovery): make it writable",
    "unknown": "the database's own message above names the cause",
}
_AFTER = "; then run the same command again: finished trials are kept, interrupted ones are recovered"


class StorageUnavailable(RuntimeFailure):
    """The storage failed the run (exit 1): retries ran out, or the trouble cannot pass."""

    def __init__(self, cause: str, detail: str, waited_s: float | None) -> None:
        waited = "" if waited_s is None else f" for {waited_s:.0f} s"
        super().__init__(f"the storage stopped accepting writes ({cause}{waited}): {detail}",
                         _HINTS.get(cause, _HINTS["unknown"]) + _AFTER)
        self.cause = cause


def _chain(exc: BaseException) -> list[BaseException]:
    """The error and what it wraps (Optuna's StorageInternalError, SQLAlchemy's, the driver's)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found:
        found.append(current)
        inner = getattr(current, "orig", None) or current.__cause__
        current = inner if isinstance(inner, BaseException) else None
    return found


def first_line(exc: BaseException) -> str:
    """The driver's own message (e.g. 'database or disk is full'), without SQL or parameters."""
    origin = _chain(exc)[-1]
    lines = str(origin).strip().splitlines()
    return lines[0] if lines else type(origin).__name__


def trouble_of(exc: BaseException) -> str | None:
    """'locked', 'connection lost', 'disk full', 'read-only', 'unknown' for a database error
    that is not the caller's (bad data is); None when ``exc`` is no database error at all."""
    from sqlalchemy.exc import DBAPIError  # asked once a step failed: the package imports none

    chain = _chain(exc)
    if not any(isinstance(e, DBAPIError) or type(e).__module__.split(".")[0] in
               ("sqlite3", "psycopg", "psycopg2") for e in chain):
        return None
    for error in chain:
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state in _SQLSTATE:
            return _SQLSTATE[state]
        if str(state or "").startswith("08"):  # PostgreSQL's connection exceptions
            return "connection lost"
    text = " ".join(str(e).lower() for e in chain)
    for cause, fragments in (("disk full", _DISK_FULL), ("read-only", _READ_ONLY),
                             ("locked", _LOCKED), ("connection lost", _CONNECTION)):
        if any(fragment in text for fragment in fragments):
            return cause
    if any(isinstance(e, DBAPIError) and e.connection_invalidated for e in chain):
        return "connection lost"
    return "unknown"


class Retrying:
    """Runs storage steps, retrying transient trouble for ``retry_s`` seconds.

    Thread safety: one instance serves the orchestrator's loop; nested steps (an Optuna call
    inside one of our steps) are retried once, by the outermost.
    """

    def __init__(self, retry_s: float, dialect: str) -> None:
        self.retry_s = retry_s
        self.dialect = dialect
        self._depth = threading.local()
        self._give_up = threading.Event()

    def give_up(self) -> None:
        """Stop waiting (a second Ctrl-C): the step in progress fails at its next retry."""
        self._give_up.set()

    def transient(self, cause: str) -> bool:
        # sqlite read-only is a permission or a mount; on a server it is a failover
        return cause in ("locked", "connection lost") or (cause == "read-only"
                                                          and self.dialect != "sqlite")

    def call(self, step: Callable[[], T]) -> T:
        depth = getattr(self._depth, "value", 0)
        if depth:
            return step()
        self._depth.value = 1
        try:
            return self._with_retries(step)
        finally:
            self._depth.value = 0

    def _with_retries(self, step: Callable[[], T]) -> T:
        first_failure: float | None = None
        delay = _BACKOFF_FIRST_S
        while True:
            try:
                return step()
            except StorageUnavailable:
                raise
            except Exception as exc:
                cause = trouble_of(exc)
                if cause is None:
                    raise
                now = time.monotonic()
                if first_failure is None:
                    first_failure = now
                    if self.transient(cause) and self.retry_s > 0:
                        _log.warning("storage trouble (%s: %s): retrying for up to %.0f s",
                                     cause, first_line(exc), self.retry_s)
                waited = now - first_failure
                if not self.transient(cause) or waited >= self.retry_s or self._give_up.is_set():
                    if cause == "unknown" and not self.transient(cause):
                        raise  # bad data (too long a value...): the caller's error, as before
                    raise StorageUnavailable(cause, first_line(exc),
                                             waited if self.transient(cause) else None) from exc
                time.sleep(min(delay * (0.5 + random.random()), self.retry_s - waited))
                delay = min(delay * 2, _BACKOFF_MAX_S)



def retried(method: Callable[..., T]) -> Callable[..., T]:
    """Declares a storage method a retried step: it runs through its storage's ``retrying``
    (a :class:`Retrying` once a run starts retrying), or as it is while that is None (study
    set-up: its errors are exit 2). Declared on the method, so it follows a rename; the
    storage's test checks that every public method is retried or exempt by name and reason."""

    @functools.wraps(method)
    def step(self: Any, *args: Any, **kwargs: Any) -> T:
        retrying = self.retrying
        if retrying is None:
            return method(self, *args, **kwargs)
        return retrying.call(lambda: method(self, *args, **kwargs))

    step.retried = True  # type: ignore[attr-defined]
    return step


def is_retried(method: Any) -> bool:
    """Whether ``method`` was declared with :func:`retried`."""
    return getattr(method, "retried", False) is True


def retrying_of(storage: Any) -> Retrying:
    """The retrier of a run's storage (a MirrorStorage that started retrying); one that never
    retries otherwise."""
    found = getattr(storage, "retrying", None)
    return found if isinstance(found, Retrying) else Retrying(0.0, storage.engine.dialect.name)
