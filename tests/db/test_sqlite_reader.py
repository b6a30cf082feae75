"""A reader holding a read transaction on the run's sqlite database (a sqlite3 shell, a
dashboard) fails no trial: WAL lets the run's writes go on beside it (db/connect.py)."""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.conftest import start_cli, trial_rows
from tests.e2e.test_orchestrator import TARGET, _wait_for_running

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_long_reader_causes_no_failure(tmp_path: Path) -> None:
    """A sqlite3 shell or dashboard holding a read transaction must not fail trials (WAL)."""
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "pinned",
                     "scheduler.parallel=2", "study.n_trials=12", "pruner=none",
                     env={"HPO_TEST_STEP_S": "0.2"})
    db = tmp_path / "hpo.db"
    _wait_for_running(db, 0)
    complete = "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'"
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    (seen,) = reader.execute(complete).fetchone()  # its snapshot, held until COMMIT
    # While it holds it, trials end (a write met the reader): another connection sees them,
    # the reader still sees its snapshot.
    deadline, now_complete = time.monotonic() + 60, seen
    while time.monotonic() < deadline and now_complete < seen + 2:
        time.sleep(0.2)
        with closing(sqlite3.connect(db, timeout=30)) as other:
            (now_complete,) = other.execute(complete).fetchone()
    assert now_complete >= seen + 2, "no trial ended while the reader held its transaction"
    assert reader.execute(complete).fetchone() == (seen,)
    reader.execute("COMMIT")
    reader.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    rows = trial_rows(db)
    assert len(rows) == 12 and all(r["state"] == "COMPLETE" for r in rows)
