"""Retrying storage steps (db/_retry.py ``Retrying``): transient trouble (a lock, a lost
connection, a server's read-only failover) is retried with backoff for ``storage.retry_s``
and no longer; a full disk or a read-only sqlite file stops at once; bad data is the caller's
error, raised as it was; a nested step is retried once, by the outermost; a second Ctrl-C
stops the waiting. A fake clock: nothing sleeps here."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import sqlalchemy.exc

import hpo_orchestrator.db._retry as retry_module
from hpo_orchestrator.db import Retrying, StorageUnavailable


def _db_error(message: str) -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("UPDATE trials ...", {}, sqlite3.OperationalError(message))


LOCKED, FULL = "database is locked", "database or disk is full"
READ_ONLY, LOST = "attempt to write a readonly database", "server closed the connection unexpectedly"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The module's time: monotonic() reads ``now``, sleep() advances it and is recorded."""
    fake = SimpleNamespace(now=0.0, sleeps=[])

    def sleep(seconds: float) -> None:
        fake.sleeps.append(seconds)
        fake.now += seconds

    monkeypatch.setattr(retry_module, "time", SimpleNamespace(monotonic=lambda: fake.now, sleep=sleep))
    return fake


def _failing(times: int, message: str, then: object = "done") -> tuple[Callable[[], object], list[int]]:
    calls: list[int] = []

    def step() -> object:
        calls.append(1)
        if len(calls) <= times:
            raise _db_error(message)
        return then
    return step, calls


@pytest.mark.parametrize("message", [LOCKED, LOST])
def test_transient_trouble_is_retried_until_it_passes(clock: SimpleNamespace, message: str) -> None:
    step, calls = _failing(4, message)
    assert Retrying(60.0, "sqlite").call(step) == "done"
    assert len(calls) == 5 and len(clock.sleeps) == 4
    assert clock.sleeps[-1] > clock.sleeps[0]  # backing off


def test_retries_stop_at_retry_s_and_name_the_cause(clock: SimpleNamespace) -> None:
    step, calls = _failing(10_000, LOCKED)
    with pytest.raises(StorageUnavailable, match=r"locked for 30 s") as raised:
        Retrying(30.0, "sqlite").call(step)
    assert raised.value.cause == "locked"
    assert 30.0 <= clock.now <= 30.0 + 1e-6  # waited it out, and no longer
    assert len(calls) > 3


@pytest.mark.parametrize(("message", "dialect", "cause"), [
    (FULL, "sqlite", "disk full"), (FULL, "postgresql", "disk full"),
    (READ_ONLY, "sqlite", "read-only")])  # a file's permissions or a mount: it will not pass
def test_lasting_trouble_stops_at_once(clock: SimpleNamespace, message: str, dialect: str,
                                       cause: str) -> None:
    step, calls = _failing(1, message)
    with pytest.raises(StorageUnavailable) as raised:
        Retrying(60.0, dialect).call(step)
    assert raised.value.cause == cause and len(calls) == 1 and clock.sleeps == []
    assert " for " not in raised.value.message.split(":")[0]  # no wait to report


def test_read_only_on_a_server_is_a_failover_and_retried(clock: SimpleNamespace) -> None:
    step, calls = _failing(2, READ_ONLY)
    assert Retrying(60.0, "postgresql").call(step) == "done" and len(calls) == 3


def test_no_retry_when_retry_s_is_zero(clock: SimpleNamespace) -> None:
    step, calls = _failing(1, LOCKED)
    with pytest.raises(StorageUnavailable, match="locked"):
        Retrying(0.0, "sqlite").call(step)
    assert len(calls) == 1 and clock.sleeps == []


def test_bad_data_and_other_errors_are_the_callers(clock: SimpleNamespace) -> None:
    def too_long() -> None:
        raise sqlalchemy.exc.DataError("INSERT ...", {}, sqlite3.DataError("string or blob too big"))

    with pytest.raises(sqlalchemy.exc.DataError):
        Retrying(60.0, "sqlite").call(too_long)
    with pytest.raises(ZeroDivisionError):
        Retrying(60.0, "sqlite").call(lambda: 1 / 0)
    assert clock.sleeps == []


def test_a_nested_step_is_retried_by_the_outermost_only(clock: SimpleNamespace) -> None:
    retrying = Retrying(60.0, "sqlite")
    inner, inner_calls = _failing(2, LOCKED)
    outer_calls: list[int] = []

    def outer() -> object:
        outer_calls.append(1)
        return retrying.call(inner)  # an Optuna call inside one of our transactions

    assert retrying.call(outer) == "done"
    assert len(inner_calls) == 3 and len(outer_calls) == 3  # each failure: one whole retry


def test_give_up_stops_the_waiting(clock: SimpleNamespace) -> None:
    retrying = Retrying(600.0, "sqlite")
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 3:
            retrying.give_up()  # a second Ctrl-C meanwhile
        raise _db_error(LOCKED)

    with pytest.raises(StorageUnavailable, match="locked"):
        retrying.call(step)
    assert len(calls) == 3 and clock.now < 600.0
