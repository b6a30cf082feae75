"""A trial's end is a value (issue 29, item 3; study/_end.py): the orchestrator stages a frozen
``TrialEnd`` and calls Optuna's tell, and the storage writes all of it (attrs, the true end
time, the summary row, telemetry samples, the retry, the tally's fold) in the transaction that
finishes the trial, with no call back into the scheduler."""

from __future__ import annotations

import dataclasses
import warnings
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

import hpo_orchestrator.db as db
from hpo_orchestrator.db import connect, tables
from hpo_orchestrator.study import MirrorStorage, Requeue, TrialEnd
from hpo_orchestrator.tally import advance_tally
from hpo_orchestrator.tally._tally import Tally, read_tally


def test_a_trial_end_holds_values_only() -> None:
    end = TrialEnd(1, "s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        end.fold_tally = True  # type: ignore[misc]
    assert not any("Callable" in str(f.type) for f in dataclasses.fields(TrialEnd))


def test_the_tell_writes_the_whole_end_in_its_transaction(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'end.db'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = connect.open_rdb_storage(url)
    tables.ensure_tables(backend.engine)
    storage = MirrorStorage(backend, refresh_s=60.0)
    study = optuna.create_study(study_name="s", storage=storage)
    first = study.ask()
    study.tell(first, 1.0)
    with backend.engine.begin() as connection:  # a tally to fold the trials into
        advance_tally(connection, study._study_id, "s", rebuild=True)
    trial = study.ask()
    x = trial.suggest_float("x", 0.0, 1.0)
    ended = datetime(2024, 1, 1, 12, 0, 0)
    summary = db.SummaryRow(trial._trial_id, study._study_id, trial.number, "FAIL",
                            host="h", start_s=ended.timestamp() - 5, end_s=ended.timestamp(),
                            gpu_energy_j=7.0, fail_reason="oom")
    storage.stage_end(trial._trial_id, TrialEnd(
        study._study_id, "s", {"hpo.fail_reason": "oom", "hpo.retried": True}, ended=ended,
        summary=summary, samples=[{"trial_id": trial._trial_id, "ts": ended, "sm_util": 50.0}],
        retry=Requeue({"x": x}, {"hpo.retry_of": trial.number, "hpo.retry_reason": "oom"}),
        fold_tally=True))
    study.tell(trial, state=TrialState.FAIL)

    told = backend.get_trial(trial._trial_id)
    assert told.state == TrialState.FAIL and told.datetime_complete == ended
    assert told.user_attrs == {"hpo.fail_reason": "oom", "hpo.retried": True}
    [retry] = backend.get_all_trials(study._study_id, states=(TrialState.WAITING,))
    assert retry.user_attrs == {"hpo.retry_of": trial.number, "hpo.retry_reason": "oom"}
    assert retry.system_attrs["fixed_params"] == {"x": x}
    with backend.engine.connect() as connection:
        [row] = [r for r in db.summary_rows(connection, study._study_id) if r.number == 1]
        assert (row.state, row.gpu_energy_j) == ("FAIL", 7.0)
        samples = connection.execute(sqlalchemy.text(
            "SELECT sm_util FROM hpo_telemetry WHERE trial_id = :t"), {"t": trial._trial_id}).all()
        assert [s for (s,) in samples] == [50.0]
        stored = read_tally(connection, study._study_id)
    assert stored is not None and Tally.from_json(stored[1]).folded == 2  # folded in with it
