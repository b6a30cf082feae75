"""A sqlite file deleted or truncated under a run (study/_lost.py): the run stops with exit 1
and says so, prints no count of trials the storage no longer has, and saves what it holds
where ``storage.url=sqlite:///<file>`` loads it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import rows_while_running, start_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_a_database_gone_under_the_run_stops_it_and_keeps_its_trials(
        tmp_path: Path, how: str) -> None:
    run = start_cli(tmp_path, "run", "objective=custom",
                    "objective.target=tests.objectives:sleepy", "study.n_trials=8",
                    "scheduler.parallel=1", "scheduler.gpus=none",
                    env={"HPO_TEST_SLEEP_S": "1"})
    deadline = time.monotonic() + 120
    done: list[int] = []
    while time.monotonic() < deadline and run.poll() is None and len(done) < 2:
        done = [r["number"] for r in rows_while_running(tmp_path) if r["state"] == "COMPLETE"]
        time.sleep(0.1)
    assert len(done) >= 2 and run.poll() is None
    db = tmp_path / "hpo.db"
    if how == "deleted":
        db.unlink()
    else:
        db.write_bytes(b"")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, out + err
    said = re.search(rf"error: the database hpo\.db was {how} while the run wrote to it: the run "
                     r"stopped \(its running trials too\) and saved (\d+) finished trial\(s\) of "
                     r"study 'hpo' in (\S+\.db)\n", err)
    assert said, err
    assert "this run: complete" not in out and "no longer in the storage" in out, out
    saved = optuna.load_study(study_name="hpo", storage=f"sqlite:///{tmp_path / said[2]}")
    kept = {t.number for t in saved.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert set(done) <= kept and len(kept) == int(said[1]) < 8
    assert f"storage.url=sqlite:///{said[2]}" in err


def test_the_watch_keeps_the_run_s_sqlite_locks(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it. A watch
    that opened and closed the database let another process's last connection delete the
    write-ahead log under the run's live connection (the next reader: "disk I/O error")."""
    import sqlite3
    import subprocess
    import sys

    from hpo_orchestrator.study import SqliteWatch

    db = tmp_path / "hpo.db"
    run = sqlite3.connect(db)
    run.execute("PRAGMA journal_mode=WAL")
    run.execute("CREATE TABLE t (x)")
    run.execute("INSERT INTO t VALUES (1)")
    run.commit()
    watch = SqliteWatch(db)
    assert watch.lost(force=True) is None
    assert watch.lost(force=True) is None
    other = (f"import sqlite3; c = sqlite3.connect({str(db)!r}); "
             "c.execute('SELECT x FROM t').fetchall(); c.close()")
    subprocess.run([sys.executable, "-c", other], check=True, timeout=60)
    # the other connection was not the last one: the run's log and its index stay
    assert (tmp_path / "hpo.db-wal").exists() and (tmp_path / "hpo.db-shm").exists()
    run.close()
