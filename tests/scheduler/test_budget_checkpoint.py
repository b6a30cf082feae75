"""The budget's checkpoint (scheduler/_budget.py): trials below it are settled (finished more
than _SETTLE_S ago) and counted once; the checkpoint never steps past a trial that can still
change what it counts (RUNNING, WAITING, or finished too recently), however many settled
trials lie after it, so every claim counts exactly what ``count_claimed`` counts.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from hpo_orchestrator.db.connect import open_rdb_storage
from hpo_orchestrator.scheduler import Budget, count_claimed
from hpo_orchestrator.scheduler._budget import _ADVANCE_AT

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _age(storage: optuna.storages.RDBStorage, where: str, hours: float) -> None:
    with storage.engine.begin() as connection:
        connection.execute(sqlalchemy.text(f"UPDATE trials SET datetime_complete = :d WHERE {where}"),
                           {"d": datetime.now() + timedelta(hours=hours)})


@pytest.mark.parametrize("state", ["RUNNING", "WAITING", "recent"])
@pytest.mark.parametrize("after", [_ADVANCE_AT, _ADVANCE_AT + 9])
def test_the_checkpoint_never_steps_past_an_unsettled_trial(tmp_path: Path, state: str,
                                                            after: int) -> None:
    """An unsettled trial first, then ``after`` (>= _ADVANCE_AT) trials finished an hour ago:
    the checkpoint stays below it, so the count stays exact on every claim, and the budget
    starts no trial more than n_trials, before and after that trial ends."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    storage = open_rdb_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    first = study.ask()
    if state == "recent":
        study.tell(first, 0.0)  # finished just now: a retry mark may still be on its way
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=after)
    if state == "WAITING":  # enqueued before the others (set here: optimize would take it)
        with storage.engine.begin() as connection:
            connection.execute(sqlalchemy.text("UPDATE trials SET state = 'WAITING' WHERE number = 0"))
    _age(storage, "number > 0" if state != "WAITING" else "number >= 0", hours=-1)
    if state == "recent":
        _age(storage, "number = 0", hours=1)
    n_trials = after + 1
    budget = Budget(storage.engine, study._study_id, n_trials, None)
    counted = after + (0 if state == "WAITING" else 1)
    for _ in range(3):  # the first claim may move the checkpoint; the later ones read above it
        assert budget.claimed() == counted
    with storage.engine.connect() as connection:
        assert count_claimed(connection, study._study_id) == counted
    assert budget._upto is not None and budget._upto < study.trials[0]._trial_id

    if state == "RUNNING":
        study.tell(first, 1.0)  # it ends: still one trial, counted once
        _age(storage, "number = 0", hours=-1)
    elif state == "recent":  # its retry mark lands late: it no longer counts (its retry will)
        with storage.engine.begin() as connection:  # another writer: Optuna refuses it now
            connection.execute(sqlalchemy.text(
                "INSERT INTO trial_user_attributes (trial_id, key, value_json) "
                "VALUES (:t, 'hpo.retried', 'true')"), {"t": first._trial_id})
        assert budget.claimed() == after
        study.tell(study.ask(), 2.0)
        _age(storage, "number = 0", hours=-1)
    elif state == "WAITING":
        waiting = study.ask()  # now asked: it counts
        study.tell(waiting, state=TrialState.FAIL)
        _age(storage, "number = 0", hours=-1)
    assert budget.claimed() == n_trials
    assert budget.claim(study.ask) is None  # full: no trial n_trials + 1
    retried = 1 if state == "recent" else 0  # its retry ran in its place
    assert budget.claimed() == n_trials and len(study.trials) == n_trials + retried


def test_a_claim_whose_lock_ends_in_trouble_keeps_the_trial_it_asked(tmp_path: Path) -> None:
    """pg_terminate_backend on the orchestrator's connections: the ask went through, then the
    budget lock's connection failed as it ended, and the claim was retried whole. It asked a
    second trial, and the first, held by nobody, was reaped as 'lost' (a FAIL in the study,
    test_terminated_postgresql_connections_during_a_run). Retried, the claim keeps its trial."""
    from contextlib import contextmanager

    from hpo_orchestrator.db import Retrying

    storage = open_rdb_storage(f"sqlite:///{tmp_path / 'b.db'}")
    study = optuna.create_study(storage=storage)
    budget = Budget(storage.engine, study._study_id, 5, None, Retrying(30.0, "sqlite"))
    ends = []

    @contextmanager
    def locked():  # type: ignore[no-untyped-def]
        yield None
        ends.append(1)
        if len(ends) == 1:  # the lock's connection was terminated as the claim ended
            raise sqlalchemy.exc.OperationalError(
                "SELECT pg_advisory_unlock", {}, Exception("server closed the connection unexpectedly"))

    budget._locked = locked  # type: ignore[method-assign]
    trial = budget.claim(study.ask)
    assert trial is not None and [t.number for t in study.trials] == [trial.number] == [0]
