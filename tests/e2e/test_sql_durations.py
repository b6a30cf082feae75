"""The README's SQL on a real run stopped by Ctrl-C and by kill -9: every trial's duration is
the one it ran, and the counts are those the run printed (docs/RELIABILITY.md "Stopping,
storage, kill -9").

The objective (tests/objectives.py ``stamped``) writes the wall-clock time of its start and of
each report: the stored start is no later than the objective's start, and the stored end no
earlier than the last report the database held when the run was stopped, nor later than the
stop. A trial asked ahead that no slot took never ran: it is back in the queue (WAITING, no
start), not a FAIL of a second.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import rows_while_running, start_cli, trial_rows
from tests.repo.test_readme import blocks

TARGET = "objective.target=tests.objectives:stamped"
ARGS = ("run", "objective=custom", TARGET, "scheduler.parallel=2", "scheduler.prefetch=1",
        "study.n_trials=6", "pruner=none", "scheduler.worker_mode=fresh")
_CLOCK_S = 0.01  # julianday's float and sqlite's millisecond clock: not a bound on the run


def _readme_sql(db: Path) -> tuple[dict[str, int], dict[str, float]]:
    """The README's first two statements as written: counts by state, mean seconds by state."""
    counts_sql, durations_sql = [s for s in blocks("sql")[0].split(";") if s.strip()][:2]
    with sqlite3.connect(db) as con:
        counts = {state: n for state, n in con.execute(counts_sql)}
        durations = {state: avg for state, avg, _n in con.execute(durations_sql)}
    return counts, durations


def _stamps(folder: Path, number: int) -> dict[str, float]:
    """What trial ``number``'s objective saw: "start" and each step's report time."""
    lines = (folder / f"{number}.txt").read_text().split()
    return dict(zip(lines[::2], map(float, lines[1::2]), strict=True))


def _stored_steps(db: Path) -> dict[int, int]:
    """trial number -> its highest report in the database (trials with none left out)."""
    try:
        with sqlite3.connect(db) as con:
            return {n: s for n, s in con.execute(
                "SELECT t.number, MAX(i.step) FROM trials t JOIN trial_intermediate_values i "
                "ON i.trial_id = t.trial_id GROUP BY t.number")}
    except sqlite3.Error:  # being created
        return {}


def _wait_for_two_running_and_one_asked_ahead(proc, db: Path) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """Two trials on slots with at least 5 stored reports each, and one asked ahead (its owner
    written, no hpo.pid): the moment to stop the run. Returns the stored steps then."""
    while proc.poll() is None:
        rows = rows_while_running(db.parent)
        running = [r for r in rows if r["state"] == "RUNNING"]
        on_slots = [r for r in running if "hpo.pid" in r["attrs"]]
        ahead = [r for r in running if "hpo.pid" not in r["attrs"]
                 and "hpo.orchestrator_pid" in r["attrs"]]
        steps = _stored_steps(db)
        if len(on_slots) == 2 and len(ahead) == 1 \
                and all(steps.get(r["number"], 0) >= 5 for r in on_slots):
            return {r["number"]: steps[r["number"]] for r in on_slots}
        time.sleep(0.1)
    raise AssertionError(f"the run ended first: {proc.communicate()}")


def _epoch(text: str | None) -> float:
    assert text is not None
    return datetime.fromisoformat(text).timestamp()  # local time, as Optuna stores it


def _check_ran(db: Path, stamps: Path, stored: dict[int, int], stopped_at: float) -> None:
    """Each stopped trial: started no later than its objective did, ended no earlier than its
    last report stored before the stop and no later than the stop; the README's mean for
    FAIL is the mean of those durations."""
    rows = {r["number"]: r for r in trial_rows(db)}
    durations = []
    for number, step in stored.items():
        row, seen = rows[number], _stamps(stamps, number)
        assert row["state"] == "FAIL", row
        start, end = _epoch(row["start"]), _epoch(row["end"])
        assert start <= seen["start"] + _CLOCK_S, (row, seen["start"])
        assert end >= seen[str(step)] - _CLOCK_S, \
            f"trial {number} ends {seen[str(step)] - end:.2f} s before its report {step}"
        assert end <= stopped_at + _CLOCK_S, (row, stopped_at)
        durations.append(end - start)
    _counts, means = _readme_sql(db)
    assert means["FAIL"] == pytest.approx(sum(durations) / len(durations), abs=_CLOCK_S)


@pytest.mark.slow
def test_readme_sql_after_ctrl_c(tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    env = {"HPO_TEST_STAMPS": str(stamps)}
    run = start_cli(tmp_path, *ARGS, env=env)
    db = tmp_path / "hpo.db"
    stored = _wait_for_two_running_and_one_asked_ahead(run, db)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    stopped_at = time.time()
    assert run.returncode == 130, err
    counts, _means = _readme_sql(db)
    # what the run printed is what the database holds: 2 interrupted FAIL and their 2
    # retries, the third back in the queue (it was a 0.9 s FAIL with a start, and the run
    # said "interrupted: 2")
    assert counts == {"FAIL": 2, "WAITING": 3}, counts
    assert "re-run 2" in out and "interrupted: 2" in out, out
    waiting = [r for r in trial_rows(db) if r["state"] == "WAITING"]
    assert all(r["start"] is None and r["end"] is None for r in waiting), waiting
    assert len([r for r in waiting if "hpo.retry_of" not in r["attrs"]]) == 1, waiting
    _check_ran(db, stamps, stored, stopped_at)


@pytest.mark.slow
def test_readme_sql_after_kill_9(tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    # heartbeats every 10 s (the default): a trial of a few seconds has one, from its ask
    env = {"HPO_TEST_STAMPS": str(stamps)}
    run = start_cli(tmp_path, *ARGS, env=env)
    db = tmp_path / "hpo.db"
    _wait_for_two_running_and_one_asked_ahead(run, db)
    run.kill()
    run.communicate()
    stored = {n: s for n, s in _stored_steps(db).items()
              if n in {r["number"] for r in trial_rows(db) if "hpo.pid" in r["attrs"]}}
    # The lost trials' ends are their last signs of life, read through the database's clock
    # by the restart's reaping (late by that read's few ms at most): before the restart began,
    # never at its reaping.
    restarted_at = time.time()
    again = start_cli(tmp_path, *ARGS, env={**env, "HPO_TEST_STEPS": "2", "HPO_TEST_STEP_S": "0"})
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, err
    _check_ran(db, stamps, stored, restarted_at)  # they were stored at 0.0 and 0.54 s
    # the two that ran are lost and run again; the one asked ahead was never run: queued
    counts, _means = _readme_sql(db)
    assert counts == {"FAIL": 2, "COMPLETE": 6}, counts
    assert all(r["attrs"].get("hpo.fail_reason") == "lost"
               for r in trial_rows(db) if r["state"] == "FAIL")
    assert "recovering 2 trial(s)" in out and "1 trial(s) the stopped run had asked ahead" in out
    assert "lost: 2" in out, out
