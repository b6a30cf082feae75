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
