"""What the study's budget (scheduler/_budget.py) tells a run, read on a sqlite study built
here: the room left under study.n_trials, the RUNNING trials an orchestrator asked (not one
made by ``optuna ask``), and the checkpoint that keeps the count of settled trials.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from hpo_orchestrator.db.connect import open_rdb_storage
from hpo_orchestrator.scheduler import Budget
from hpo_orchestrator.scheduler._budget import _ADVANCE_AT
from hpo_orchestrator.scheduler._recovery import MAX_LOST_RUNS

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(tmp_path: Path) -> tuple[optuna.storages.RDBStorage, optuna.Study]:
    storage = open_rdb_storage(f"sqlite:///{tmp_path / 'b.db'}")
    return storage, optuna.create_study(study_name="s", storage=storage)


@pytest.mark.parametrize(("finished", "n_trials", "left"), [
    (0, 5, 5), (3, 5, 2), (5, 5, 0), (7, 5, 0)])
def test_left_is_the_room_under_n_trials_and_never_below_zero(
        tmp_path: Path, finished: int, n_trials: int, left: int) -> None:
    storage, study = _study(tmp_path)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=finished)
    study.enqueue_trial({"x": 0.5})  # WAITING: not claimed
    assert Budget(storage.engine, study._study_id, n_trials, None).left() == left


@pytest.mark.parametrize("known", [False, True], ids=["counted", "by-id"])
def test_running_counts_the_trials_an_orchestrator_asked(tmp_path: Path, known: bool) -> None:
    """A RUNNING trial with an orchestrator's marks counts, whichever host runs it; one asked
    by ``optuna ask`` outside any run is its maker's to finish and does not; nor do a finished
    trial with the same marks and a WAITING one. Read by counting over the study, or (the
    run's mirror knows its unfinished ids) by reading those ids."""
    storage, study = _study(tmp_path)
    ours = [study.ask() for _ in range(2)]
    for trial, host in zip(ours, ("here", "elsewhere"), strict=True):
        trial.set_user_attr("hpo.host", host)
        trial.set_user_attr("hpo.pid", 4321)
    outside = study.ask()  # optuna ask: no orchestrator's marks
    done = study.ask()
    done.set_user_attr("hpo.pid", 1234)
    study.tell(done, 1.0)
    study.enqueue_trial({"x": 0.5})
    unfinished = {t._trial_id for t in study.get_trials(deepcopy=False)
                  if not t.state.is_finished()}
    budget = Budget(storage.engine, study._study_id, 10, None,
                    unfinished=(lambda: unfinished) if known else None)
    assert budget.running() == 2
    study.tell(ours[0], 2.0)
    unfinished.discard(ours[0]._trial_id)
    assert budget.running() == 1
    assert outside._trial_id in unfinished  # it was there to be counted, and was not


def _finished_at(storage: optuna.storages.RDBStorage, hours: float) -> None:
    with storage.engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE trials SET datetime_complete = :d"),
                           {"d": datetime.now() + timedelta(hours=hours)})


def test_the_checkpoint_moves_over_trials_that_settled_and_keeps_their_count(tmp_path: Path) -> None:
    """Trials still recent at one claim settle later: once _ADVANCE_AT or more lie above the
    checkpoint, a claim moves it over them, and later claims count them from what it kept
    (reading only the trials above it), still exactly."""
    storage, study = _study(tmp_path)
    n = _ADVANCE_AT + 3
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)
    _finished_at(storage, hours=1)  # all of them recent, however slow this machine is
    budget = Budget(storage.engine, study._study_id, n + 10, None)
    assert budget.claimed() == n  # none settled yet
    first = budget._upto
    _finished_at(storage, hours=-1)  # an hour later, as far as the count can tell
    assert budget.claimed() == n  # this claim moves the checkpoint
    last = max(t._trial_id for t in study.trials)
    assert first is not None and first < last and budget._upto == last
    study.tell(study.ask(), 1.0)  # one more, above the checkpoint
    assert budget.claimed() == n + 1
    assert budget._upto == last


@pytest.mark.parametrize("above", [_ADVANCE_AT, _ADVANCE_AT - 1])
def test_the_checkpoint_moves_from_advance_at_settled_trials_above_it(tmp_path: Path,
                                                                      above: int) -> None:
    storage, study = _study(tmp_path)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=above)
    _finished_at(storage, hours=1)
    budget = Budget(storage.engine, study._study_id, 1000, None)
    assert budget.claimed() == above
    first = budget._upto
    _finished_at(storage, hours=-1)
    assert budget.claimed() == above
    last = max(t._trial_id for t in study.trials)
    assert budget._upto == (last if above >= _ADVANCE_AT else first)


def test_a_trial_settles_once_it_finished_more_than_settle_s_ago(tmp_path: Path) -> None:
    """At the first claim the checkpoint goes up to the last trial finished _SETTLE_S or more
    before it (a study all settled is kept whole); a trial finished a moment ago stays above
    it, whatever comes after it."""
    from hpo_orchestrator.scheduler._budget import _SETTLE_S

    storage, study = _study(tmp_path)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=4)
    ids = [t._trial_id for t in study.trials]
    _finished_at(storage, hours=-1)
    whole = Budget(storage.engine, study._study_id, 10, None)
    assert whole.claimed() == 4 and whole._upto == ids[-1]
    with storage.engine.begin() as connection:  # the third ended a moment ago
        connection.execute(sqlalchemy.text("UPDATE trials SET datetime_complete = :d "
                                           "WHERE trial_id = :t"),
                           {"d": datetime.now() - timedelta(seconds=_SETTLE_S / 2), "t": ids[2]})
    recent = Budget(storage.engine, study._study_id, 10, None)
    assert recent.claimed() == 4 and recent._upto == ids[1]


def test_a_claim_counts_and_asks_holding_the_study_s_file_lock(tmp_path: Path) -> None:
    """sqlite: every orchestrator of the study (one host) takes the flock beside the database
    for its count and ask, so together they start no trial past n_trials."""
    import fcntl
    import os

    from hpo_orchestrator.db.connect import lock_file

    storage, study = _study(tmp_path)
    budget = Budget(storage.engine, study._study_id, 1, tmp_path / "b.db")
    held = []

    def ask() -> optuna.Trial:
        fd = os.open(lock_file(tmp_path / "b.db"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)  # another taker got it: the claim did not hold it
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        return study.ask()

    assert budget.claim(ask) is not None and held == [True]
    assert budget.claim(ask) is None and held == [True]  # full: no second ask


def test_a_run_reaps_its_host_s_orphans_and_waits_for_the_others(tmp_path: Path) -> None:
    """A RUNNING trial asked on this host by an orchestrator that no longer exists (kill -9)
    is an orphan, reaped by the run; a live orchestrator's, another host's and one asked
    outside any run run elsewhere. Of the orphans, those reaped with a retry leave the count:
    not one whose params were lost too many times in a row (a loss spends no retry), nor one
    already marked retried."""
    import os
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    storage, study = _study(tmp_path)

    def running(host: str | None, owner: int | None, **attrs: object) -> int:
        trial = study.ask()
        if host is not None:
            trial.set_user_attr("hpo.host", host)
            trial.set_user_attr("hpo.orchestrator_pid", owner)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return trial._trial_id

    ahead = running("here", dead.pid)  # no slot took it yet: back to the queue
    spent = running("here", dead.pid, **{"hpo.pid": dead.pid, "hpo.attempt": 3,
                                         "hpo.lost_runs": MAX_LOST_RUNS - 1})
    marked = running("here", dead.pid, **{"hpo.retried": True})
    live = running("here", os.getpid())
    elsewhere = running("there", dead.pid)
    outside = running(None, None)
    unfinished = {ahead, spent, marked, live, elsewhere, outside}
    budget = Budget(storage.engine, study._study_id, 10, None, unfinished=lambda: unfinished)
    assert sorted(budget.orphans("here")) == sorted([ahead, spent, marked])
    assert budget.running_elsewhere("here") == 3  # live, elsewhere, outside
    # the one asked ahead goes back to the queue; the others ran out of retries or have one
    assert budget.recoverable(storage, "here", max_retries=2) == (0, 1)
    assert budget.orphans("there") == [elsewhere]
    assert budget.running_elsewhere("there") == 5
    # reaping reads the trials the run's mirror knows: without it, none
    assert Budget(storage.engine, study._study_id, 10, None).orphans("here") == []


def test_a_budget_without_retries_gives_up_at_the_first_trouble(tmp_path: Path) -> None:
    """Retrying is the run's to give (storage.retry_s); without it a read that meets a locked
    database fails at once, as StorageUnavailable, tried once."""
    from hpo_orchestrator.db._retry import StorageUnavailable

    storage, study = _study(tmp_path)
    budget = Budget(storage.engine, study._study_id, 10, None)
    tries = []

    def locked() -> int:
        tries.append(1)
        raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked"))

    with pytest.raises(StorageUnavailable):
        budget.retrying.call(locked)
    assert tries == [1]
