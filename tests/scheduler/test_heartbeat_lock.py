"""A write lock held by another process never turns the run's own live trial into a lost one
(scheduler/_recovery.py, db/_run_io.py record_heartbeat).

Optuna's record_heartbeat reads the database's clock, then waits for the write lock: a 30 s
lock stored a heartbeat 30 s old, past the grace period, and the run's next reaping failed
its own running trial as lost and dropped its result.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from hpo_orchestrator.db import RunningTrialRow, to_datetime
from hpo_orchestrator.db.connect import open_rdb_storage
from hpo_orchestrator.study import MirrorStorage
from tests.conftest import rows_while_running, start_cli

_BEAT = "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"
_NOW = {"sqlite": "SELECT CURRENT_TIMESTAMP", "postgresql": "SELECT clock_timestamp()::timestamp"}
_HOLD = 2.5  # how long the other process holds the lock while the heartbeat waits (s)


def test_a_trial_of_ours_is_never_reaped_for_an_old_heartbeat() -> None:
    """Our trial's heartbeat is old only when its write waited: the run watches its process.
    Another orchestrator's trial with the same heartbeat is lost."""
    from hpo_orchestrator.scheduler._recovery import Recovery

    recovery = object.__new__(Recovery)
    recovery.grace_s, recovery.host = 6.0, "here"
    now = datetime.now()
    row = RunningTrialRow(7, now - timedelta(minutes=1), now - timedelta(seconds=30), now,
                          "here", 123, 456)
    assert not recovery._lost(row, {7}, now - timedelta(seconds=6))
    assert recovery._lost(row, set(), now - timedelta(seconds=6))


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hpo.db'}"
    base: str = request.getfixturevalue("postgres_url")
    return base


def test_a_heartbeat_is_stamped_when_written_not_before_its_lock_wait(url: str) -> None:
    """Another connection holds the write lock (sqlite: the database's; PostgreSQL: the
    heartbeat's row) while the run records a heartbeat: the stamp is at or after the lock's
    release, by the database's clock."""
    storage = open_rdb_storage(url, heartbeat_interval_s=2)
    study = optuna.create_study(storage=storage, study_name=f"beat-{time.time_ns()}")
    trial_id = study.ask()._trial_id
    storage.record_heartbeat(trial_id)
    mirror = MirrorStorage(storage)
    engine = storage.engine
    backend = engine.dialect.name
    with engine.connect() as holder:
        holder.exec_driver_sql("BEGIN IMMEDIATE") if backend == "sqlite" else holder.begin()
        if backend != "sqlite":
            holder.execute(sqlalchemy.text(_BEAT + " FOR UPDATE"), {"t": trial_id})
        else:
            holder.execute(sqlalchemy.text("UPDATE trials SET number = number WHERE trial_id = :t"),
                           {"t": trial_id})
        beating = threading.Thread(target=mirror.record_heartbeat, args=(trial_id,))
        beating.start()
        time.sleep(_HOLD)  # the heartbeat waits for the lock meanwhile
        released = to_datetime(holder.execute(sqlalchemy.text(_NOW[backend])).scalar())
        holder.exec_driver_sql("COMMIT") if backend == "sqlite" else holder.commit()
    beating.join(timeout=60)
    with engine.connect() as connection:
        stamped = to_datetime(connection.execute(sqlalchemy.text(_BEAT), {"t": trial_id}).scalar())
    assert released is not None and stamped is not None
    # sqlite's clock has whole seconds: the release's second, or later
    assert stamped >= released.replace(microsecond=0), (stamped, released)


@pytest.mark.slow
def test_a_lock_longer_than_the_grace_period_leaves_the_runs_own_trial_running(
        tmp_path: Path) -> None:
    """heartbeat_interval_s=1 (grace 3 s) and a 6 s lock from another process while the only
    trial runs: the trial completes, never lost."""
    run = start_cli(tmp_path, "run", "objective=custom",
                    "objective.target=tests.objectives:sleepy", "study.n_trials=1",
                    "scheduler.parallel=1", "scheduler.gpus=none",
                    "storage.heartbeat_interval_s=1", "telemetry.enabled=false",
                    env={"HPO_TEST_SLEEP_S": "12"})  # the heartbeat: the only write meanwhile
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None and not any(
            r["state"] == "RUNNING" and r["attrs"].get("hpo.pid") for r in rows_while_running(tmp_path)):
        time.sleep(0.2)
    import sqlite3

    other = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, as a sqlite3 shell in a transaction
    time.sleep(6.0)
    other.execute("COMMIT")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out + err
    (row,) = rows_while_running(tmp_path)
    assert row["state"] == "COMPLETE" and "hpo.fail_reason" not in row["attrs"], (row, out)
    assert "lost" not in out and "reaped" not in out, out
