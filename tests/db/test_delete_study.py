"""A study deleted with Optuna (``optuna delete-study``) takes this product's rows with it on
sqlite, where its ids come back for the next study's (db/tables.py): before, the next run on
the database failed at its first trial's end on "UNIQUE constraint failed:
hpo_trial_summary.trial_id", and every rerun did the same."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import optuna
import pytest
from sqlalchemy import text

from hpo_orchestrator.db.tables import ensure_tables, insert_summary


def _rows(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as con:
        return {table: con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("hpo_trial_summary", "hpo_telemetry", "hpo_study_tally")}


def _study_with_our_rows(db: Path, name: str, trials: int) -> optuna.storages.RDBStorage:
    """A study of ``trials`` COMPLETE trials with a summary row and a sample each, and a tally."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    ensure_tables(storage.engine)
    study = optuna.create_study(storage=storage, study_name=name)
    for _ in range(trials):
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with storage.engine.begin() as connection:
        for trial in study.trials:
            insert_summary(connection, {"trial_id": trial._trial_id, "study_id": study._study_id,
                                        "number": trial.number, "state": "COMPLETE"})
            connection.execute(text("INSERT INTO hpo_telemetry (trial_id, ts) VALUES (:t, "
                                    "CURRENT_TIMESTAMP)"), {"t": trial._trial_id})
        connection.execute(text("INSERT INTO hpo_study_tally (study_id, version, tally) "
                                "VALUES (:s, 1, '{}')"), {"s": study._study_id})
    return storage


def test_deleting_a_study_deletes_our_rows_of_it(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    storage = _study_with_our_rows(db, "a", 3)
    _study_with_our_rows(db, "kept", 2)
    assert _rows(db) == {"hpo_trial_summary": 5, "hpo_telemetry": 5, "hpo_study_tally": 2}
    optuna.delete_study(study_name="a", storage=storage)
    assert _rows(db) == {"hpo_trial_summary": 2, "hpo_telemetry": 2, "hpo_study_tally": 1}


def test_rows_of_a_study_deleted_before_the_triggers_go_when_they_are_made(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    storage = _study_with_our_rows(db, "a", 3)
    with sqlite3.connect(db) as con:  # as a database of an older version has it
        con.execute("DROP TRIGGER hpo_forget_deleted_trial")
        con.execute("DROP TRIGGER hpo_forget_deleted_study")
    optuna.delete_study(study_name="a", storage=storage)
    assert _rows(db)["hpo_trial_summary"] == 3  # left behind
    ensure_tables(storage.engine)
    assert _rows(db) == {"hpo_trial_summary": 0, "hpo_telemetry": 0, "hpo_study_tally": 0}


def test_a_left_over_row_under_a_reused_trial_id_is_replaced(tmp_path: Path) -> None:
    """Already given out again (an older version left the row, a new trial got its id): the
    trial's end replaces it instead of failing."""
    storage = _study_with_our_rows(tmp_path / "hpo.db", "a", 1)
    with storage.engine.begin() as connection:
        insert_summary(connection, {"trial_id": 1, "study_id": 1, "number": 0, "state": "FAIL"})
        (state,) = connection.execute(text(
            "SELECT state FROM hpo_trial_summary WHERE trial_id = 1")).one()
    assert state == "FAIL"


@pytest.mark.slow
def test_a_run_after_optuna_deleted_the_last_study_counts_only_its_own_trials(cli) -> None:  # type: ignore[no-untyped-def]
    args = ("objective=custom", "objective.target=tests.objectives:quadratic",
            "sampler=random", "pruner=none")
    first = cli("run", *args, "study.name=a", "study.n_trials=5")
    assert first.code == 0, first.stderr
    optuna.delete_study(study_name="a", storage=f"sqlite:///{first.db}")
    second = cli("run", *args, "study.name=b", "study.n_trials=3")
    assert second.code == 0, second.stderr
    status = json.loads(cli("status", "--study", "b", "--json").stdout)
    assert status["states"]["COMPLETE"]["count"] == 3
    assert sum(d["trials"] for d in status["per_device"]) == 3


@pytest.mark.slow
def test_a_study_deleted_during_its_run_is_said_so(tmp_path: Path) -> None:
    """It ended "error: unexpected KeyError: 'no trial with id 4'" (issue 28 item 10)."""
    import time

    from tests.conftest import start_cli

    (tmp_path / "slow.py").write_text(
        "import time\n"
        "def objective(trial):\n"
        "    time.sleep(1.5)\n"
        "    return trial.suggest_float('x', 0, 1)\n")
    proc = start_cli(tmp_path, "run", "objective=custom", "objective.target=slow:objective",
                     "study.n_trials=6", "scheduler.parallel=2")
    db, deadline = tmp_path / "hpo.db", time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with sqlite3.connect(db) as con:
                if con.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]:
                    break
        except sqlite3.Error:
            pass  # not created yet
        time.sleep(0.1)
    optuna.delete_study(study_name="hpo", storage=f"sqlite:///{db}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "error: study 'hpo' was deleted from the storage during the run" in err
    assert "unexpected" not in err and "Traceback" not in err
