"""The summary row in one place, and a database of an older version migrated (issue 29, 5b).

``hpo_trial_summary``'s columns are ``SummaryRow``'s fields (db/_summary.py); SQLAlchemy's
``create_all(checkfirst=True)`` never adds a column to a table that exists, so a run's start
adds the missing ones (``tables.ensure_tables`` -> ``add_summary_columns``). Here a database as an
older version left it (its summary table made by plain DDL, without the columns this test plays
as added since: gpu_energy_j, opencl_platform, params_mismatch; no release has lacked them yet),
with a row in it, is opened by this version: the columns come, the row stays, new rows hold
every field, status reads both. On sqlite, and on PostgreSQL where HPO_TEST_POSTGRES_URL is
set (skipped, with the reason, where it is not).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import fields
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState, create_trial

import hpo_orchestrator.db as db
from hpo_orchestrator.db import SUMMARY_COLUMNS, SummaryRow, connect, tables
from hpo_orchestrator.status import collect_status
from tests.db.test_db_contract import _database

_PLAYED_NEW = ("gpu_energy_j", "opencl_platform", "params_mismatch")
# The table as an older version's SQLAlchemy made it, less the columns played as new.
_OLD_TABLE = (
    "CREATE TABLE hpo_trial_summary (trial_id INTEGER NOT NULL, study_id INTEGER NOT NULL, "
    "number INTEGER NOT NULL, state VARCHAR(8) NOT NULL, host VARCHAR(255), gpu_index INTEGER, "
    "start_s FLOAT, end_s FLOAT, startup_s FLOAT, first_decision_s FLOAT, last_step INTEGER, "
    "gpu_util_mean FLOAT, gpu_util_compute_mean FLOAT, gpu_verified BOOLEAN, "
    "fail_reason VARCHAR(32), PRIMARY KEY (trial_id))")
_OLD_INDEX = "CREATE INDEX ix_hpo_trial_summary_study_id ON hpo_trial_summary (study_id)"
_OLD_ROW = {"trial_id": None, "study_id": None, "number": 0, "state": "COMPLETE", "host": "h1",
            "gpu_index": 0, "start_s": 1000.0, "end_s": 1010.0, "startup_s": 1.5,
            "first_decision_s": 3.0, "last_step": 4, "gpu_util_mean": 80.0,
            "gpu_util_compute_mean": 90.0, "gpu_verified": True, "fail_reason": None}


def test_the_summary_columns_are_the_rows_fields() -> None:
    assert [c.name for c in tables.summary_table.columns] == list(SUMMARY_COLUMNS)
    assert SUMMARY_COLUMNS == tuple(f.name for f in fields(SummaryRow))
    # a column added to a table with rows must take NULL there: every field past the key
    required = {"trial_id", "study_id", "number", "state"}
    assert {c.name for c in tables.summary_table.columns if not c.nullable} == required
    # what status reads of a summary row are summary columns
    assert set(db.TrialRow._fields) | set(db.SummaryFlags._fields) <= set(SUMMARY_COLUMNS)


def test_a_row_from_attrs_takes_each_field_from_its_key() -> None:
    row = SummaryRow.of(7, 1, 3, "FAIL", {
        "hpo.host": "h", "hpo.gpu_index": 2, "hpo.startup_s": 1, "hpo.gpu_energy_j": 12.5,
        "hpo.gpu_verified": False, "hpo.fail_reason": "oom", "hpo.opencl_platform": "NVIDIA CUDA",
        "hpo.params_mismatch": {"lr": [0.1, 0.2]}, "hpo.gpu_util_mean": True},  # a bool: no number
        start_s=5.0, end_s=9.0, last_step=2)
    assert row == SummaryRow(7, 1, 3, "FAIL", host="h", gpu_index=2, start_s=5.0, end_s=9.0,
                             startup_s=1.0, last_step=2, gpu_energy_j=12.5, gpu_verified=False,
                             fail_reason="oom", opencl_platform="NVIDIA CUDA",
                             params_mismatch='{"lr": [0.1, 0.2]}')
    assert json.loads(row.params_mismatch) == {"lr": [0.1, 0.2]}


def _columns(engine: sqlalchemy.engine.Engine) -> list[str]:
    with engine.connect() as connection:
        return [c["name"] for c in sqlalchemy.inspect(connection).get_columns("hpo_trial_summary")]


def check_an_older_database_migrates(url: str) -> None:
    """The check itself, on a new, empty database at ``url`` (also the SQL contract's case for
    db/tables.py's ADD_COLUMN, tests/db/test_db_contract.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = connect.open_rdb_storage(url)
    try:
        study = optuna.create_study(storage=storage, study_name="old")
        for _ in range(2):
            study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
        first, second = (t._trial_id for t in study.get_trials(deepcopy=False))
        engine = storage.engine
        with engine.begin() as connection:  # what the older version left
            connection.execute(sqlalchemy.text(_OLD_TABLE))
            connection.execute(sqlalchemy.text(_OLD_INDEX))
            old = {**_OLD_ROW, "trial_id": first, "study_id": study._study_id}
            connection.execute(sqlalchemy.text(
                f"INSERT INTO hpo_trial_summary ({', '.join(old)}) "
                f"VALUES ({', '.join(':' + k for k in old)})"), old)
        assert not set(_PLAYED_NEW) & set(_columns(engine))

        tables.ensure_tables(engine)  # this version's run start

        assert sorted(_columns(engine)) == sorted(SUMMARY_COLUMNS)
        assert tables.add_summary_columns(engine) == []  # once only
        with engine.connect() as connection:
            kept = connection.execute(sqlalchemy.text(
                f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM hpo_trial_summary WHERE trial_id = :t"),
                {"t": first}).mappings().one()
        assert {k: kept[k] for k in old} == {**old, "gpu_verified": kept["gpu_verified"]}
        assert bool(kept["gpu_verified"]) and all(kept[c] is None for c in _PLAYED_NEW)

        with engine.begin() as connection:  # a trial told by this version
            tables.insert_summary(connection, SummaryRow(
                second, study._study_id, 1, "COMPLETE", host="h1", gpu_index=0, start_s=1010.0,
                end_s=1020.0, gpu_util_mean=50.0, gpu_energy_j=2500.0, gpu_verified=False,
                opencl_platform="PoCL", params_mismatch='{"lr": [0.1, 0.2]}'))
        with engine.connect() as connection:
            rows = sorted(db.summary_rows(connection, study._study_id))
            flags = db.summary_flags(connection, study._study_id)
        assert [(r.number, r.gpu_energy_j) for r in rows] == [(0, None), (1, 2500.0)]
        assert [(f.number, f.opencl_platform, f.params_mismatch) for f in flags] == [
            (1, "PoCL", {"lr": [0.1, 0.2]})]
        status = collect_status(engine, "old")
        assert [(d.trials, d.energy_kj) for d in status.per_device] == [(2, 2.5)]
    finally:
        storage.engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_database_of_an_older_version_gets_the_new_columns_and_keeps_its_rows(
        backend: str, tmp_path: Path) -> None:
    with _database(backend, tmp_path) as url:
        check_an_older_database_migrates(url)
