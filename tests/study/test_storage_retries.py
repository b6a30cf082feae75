"""Retries declared where the methods are (issue 29, item 4; study/_storage.py, db/_retry.py).

Every public method of the run's storage is either a retried step (``@retried``) or named in
``MirrorStorage.NOT_RETRIED`` with the reason, so a renamed or new method cannot silently lose
its retry; once a run starts retrying, transient trouble in such a call is waited out, and
before (study set-up: exit 2) it is not. A fake clock: nothing sleeps here."""

from __future__ import annotations

import contextlib
import inspect
import sqlite3
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import sqlalchemy.exc

import hpo_orchestrator.db._retry as retry_module
from hpo_orchestrator.db import StorageUnavailable, is_retried
from hpo_orchestrator.db.connect import open_rdb_storage
from hpo_orchestrator.study import MirrorStorage


def _public_methods(cls: type) -> dict[str, Any]:
    """The methods a caller (Optuna, the scheduler) may call: public ones, and the heartbeat
    hook Optuna calls by its underscore name."""
    found = {}
    for name in dir(cls):
        if name.startswith("__") or (name.startswith("_") and name != "_get_stale_trial_ids"):
            continue
        value = inspect.getattr_static(cls, name)
        if isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value):
            found[name] = getattr(cls, name)
    return found


def test_every_storage_method_is_retried_or_exempt_by_name() -> None:
    methods = _public_methods(MirrorStorage)
    unaccounted = sorted(name for name, method in methods.items()
                         if not is_retried(method) and name not in MirrorStorage.NOT_RETRIED)
    assert unaccounted == [], "declare them @retried, or name them in NOT_RETRIED with why"
    # an exempt name that no longer exists (renamed) or is retried after all says nothing
    stale = sorted(set(MirrorStorage.NOT_RETRIED) - set(methods))
    assert stale == [], "NOT_RETRIED names methods MirrorStorage does not have"
    both = sorted(name for name in MirrorStorage.NOT_RETRIED if is_retried(methods[name]))
    assert both == []
    assert all(why.strip() for why in MirrorStorage.NOT_RETRIED.values())
    # Optuna's calls: every abstract method of its storage API is one of ours, retried
    abstract = optuna.storages.BaseStorage.__abstractmethods__
    assert sorted(n for n in abstract if not is_retried(methods[n])) == []


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """db/_retry's time: monotonic() reads ``now``, sleep() advances it."""
    fake = SimpleNamespace(now=0.0)

    def sleep(seconds: float) -> None:
        fake.now += seconds

    monkeypatch.setattr(retry_module, "time",
                        SimpleNamespace(monotonic=lambda: fake.now, sleep=sleep))
    return fake


@pytest.fixture
def storage(tmp_path: Path) -> tuple[MirrorStorage, optuna.Study, optuna.Trial]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = open_rdb_storage(f"sqlite:///{tmp_path / 'retries.db'}",
                                   heartbeat_interval_s=60, grace_period_s=180)
    mirror = MirrorStorage(backend)
    study = optuna.create_study(storage=mirror, study_name="retries")
    with warnings.catch_warnings():  # heartbeats outside Study.optimize: the orchestrator's way
        warnings.simplefilter("ignore")
        return mirror, study, study.ask()


def _locked_once(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``target.name`` fails once with sqlite's lock error, then works; the calls counted."""
    real: Callable[..., Any] = getattr(target, name)
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.OperationalError("UPDATE ...", {},
                                                  sqlite3.OperationalError("database is locked"))
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, flaky)
    return calls


# One call of each kind: a pass-through write, a heartbeat, a study read, and the tell, whose
# transaction is the mirror's own (study/_end.py's finish_trial).
_CALLS: dict[str, tuple[str, Callable[[MirrorStorage, optuna.Study, optuna.Trial], Any]]] = {
    "set_trial_user_attr": ("backend", lambda m, s, t: m.set_trial_user_attr(t._trial_id, "k", 1)),
    "record_heartbeat": ("storage", lambda m, s, t: m.record_heartbeat(t._trial_id)),
    "get_study_user_attrs": ("backend", lambda m, s, t: m.get_study_user_attrs(s._study_id)),
    "set_trial_state_values": ("finish_trial", lambda m, s, t: s.tell(t, 1.0)),
}


@pytest.mark.parametrize("method", sorted(_CALLS))
def test_transient_trouble_in_a_storage_call_is_waited_out(
        method: str, storage: tuple[MirrorStorage, optuna.Study, optuna.Trial],
        clock: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror, study, trial = storage
    where, call = _CALLS[method]
    import hpo_orchestrator.study._end as end_module
    import hpo_orchestrator.study._storage as storage_module
    target = {"backend": mirror.backend, "storage": storage_module}.get(where, end_module)
    calls = _locked_once(target, where if where == "finish_trial" else method, monkeypatch)
    mirror.start_retrying(retry_s=60)
    call(mirror, study, trial)
    assert len(calls) == 2 and clock.now > 0  # failed, waited, ran again
    if method == "set_trial_state_values":
        assert mirror.backend.get_trial(trial._trial_id).state == optuna.trial.TrialState.COMPLETE


def test_before_a_run_retries_the_first_error_is_raised(
        storage: tuple[MirrorStorage, optuna.Study, optuna.Trial],
        clock: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Study set-up: a storage that cannot be used is exit 2 at once, not a wait."""
    mirror, _, trial = storage
    calls = _locked_once(mirror.backend, "set_trial_user_attr", monkeypatch)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        mirror.set_trial_user_attr(trial._trial_id, "k", 1)
    assert len(calls) == 1 and clock.now == 0


def test_retries_run_out_with_the_cause_named(
        storage: tuple[MirrorStorage, optuna.Study, optuna.Trial],
        clock: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror, _, trial = storage

    def locked(*_: Any) -> None:
        raise sqlalchemy.exc.OperationalError("UPDATE ...", {},
                                              sqlite3.OperationalError("database is locked"))

    import hpo_orchestrator.study._storage as storage_module

    monkeypatch.setattr(storage_module, "record_heartbeat", locked)
    mirror.start_retrying(retry_s=30)
    with pytest.raises(StorageUnavailable) as raised:
        mirror.record_heartbeat(trial._trial_id)
    assert raised.value.cause == "locked" and clock.now == pytest.approx(30.0)


class _AnswerLostOnce:
    """An engine whose next transaction commits and then fails as a terminated PostgreSQL
    connection does when the server's answer to the COMMIT is lost."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.armed = engine, True

    @contextlib.contextmanager
    def begin(self) -> Any:
        with self.engine.begin() as connection:
            yield connection
        if self.armed:
            self.armed = False
            raise sqlalchemy.exc.OperationalError("COMMIT", {}, Exception(
                "terminating connection due to administrator command"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_an_ask_whose_answer_was_lost_takes_the_trial_it_made(
        database: str, tmp_path: Path, request: pytest.FixtureRequest,
        clock: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ask's first try committed a trial and lost the answer: its retry takes that trial
    (with its attrs and heartbeat) instead of making a second one, which nobody would hold
    and recovery would reap as 'lost' (a FAIL in the study: test-long's PostgreSQL run saw
    24 COMPLETE and one such FAIL). A retry that finds nothing makes its trial as before."""
    url = request.getfixturevalue("postgres_url") if database == "postgresql" \
        else f"sqlite:///{tmp_path / 'ask.db'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mirror = MirrorStorage(open_rdb_storage(url, heartbeat_interval_s=60, grace_period_s=180))
    study = optuna.create_study(storage=mirror, study_name=f"ask-{uuid.uuid4().hex[:12]}")
    mirror.start_retrying(retry_s=60)
    attrs = {"hpo.host": "h", "hpo.orchestrator_pid": 4242}
    for lost in (True, False):
        flaky = _AnswerLostOnce(mirror.backend.engine)
        flaky.armed = lost
        monkeypatch.setattr(mirror.backend, "engine", flaky)
        before, waited = len(mirror.backend.get_all_trials(study._study_id)), clock.now
        with mirror.starting(attrs) as created, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeats outside Study.optimize
            trial = study.ask()
        monkeypatch.setattr(mirror.backend, "engine", flaky.engine)
        trials = mirror.backend.get_all_trials(study._study_id)
        assert len(trials) == before + 1 and created == {trial._trial_id}
        assert trials[-1]._trial_id == trial._trial_id and trials[-1].number == trial.number
        assert trials[-1].user_attrs == attrs
        assert (clock.now > waited) is lost  # the lost answer was waited out, then retried
