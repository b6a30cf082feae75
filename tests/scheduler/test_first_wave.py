"""The first wave (reuse mode, scheduler/orchestrator.py ``_start_first_wave``): the run's
first workers start up (imports, the objective's setup) before any trial is asked, so a
trial's RUNNING time is its own; a worker that fails or dies while starting up still ends in
a trial that says why, or in a fresh worker."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import trial_rows

pytestmark = pytest.mark.slow

OBJECTIVES = "tests.objectives"
HEADER = "this worker started up before the trial was asked"


def _run(cli, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return cli("run", "objective=custom", f"objective.target={OBJECTIVES}:pinned",
               "pruner=none", "telemetry.enabled=false", *args, env=env)


def test_the_first_trials_start_after_their_workers_set_up(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A 3 s setup: without the wait, each first trial would be handed to a worker still
    setting up, its start put back to the worker's spawn; with it, the trial starts in a
    worker that is ready. And the wait ends when the workers say ready, not at its 30 s limit: a
    first wave whose "ready" is read but not recorded took its workers for still starting
    and handed the first trials over as "in setup", their start put back to the worker's
    spawn, before the setup ended. So each first trial's recorded start comes after every
    setup's end (events in order, as each setup notes its end: no bound on a duration,
    which a loaded machine stretches)."""
    setups = tmp_path / "setup-ends"
    result = _run(cli, f"objective.setup={OBJECTIVES}:slow_setup", "scheduler.parallel=2",
                  "study.n_trials=4", env={"HPO_TEST_SETUP_S": "3", "HPO_TEST_STEP_S": "0.05",
                                           "HPO_TEST_SETUP_NOTES": str(setups)})
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 4
    first = [r for r in rows if r["attrs"]["hpo.worker_trial"] == 1]
    assert len(first) == 2  # one worker per slot, each set up once
    ends = [datetime.fromisoformat(line) for line in setups.read_text().split()]
    assert len(ends) == 2  # each worker set up once, before its first trial
    assert all(datetime.fromisoformat(r["start"]) >= max(ends) for r in first), (ends, first)
    # none was handed over while its worker still started up (the key is set only then)
    assert not [r for r in rows if "hpo.setup_running" in r["attrs"]], rows


def test_a_setup_that_fails_fails_the_first_trial_with_its_traceback(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = _run(cli, f"objective.setup={OBJECTIVES}:failing_setup", "scheduler.parallel=1",
                  "study.n_trials=1")
    rows = trial_rows(result.db)
    assert [r["state"] for r in rows] == ["FAIL"], result.stderr
    attrs = rows[0]["attrs"]
    assert attrs["hpo.fail_reason"] == "exception"
    assert "data/train.parquet" in attrs["hpo.traceback"]
    log = Path(attrs["hpo.log_path"]).read_text()
    assert HEADER in log and "loading the data" in log


def test_a_worker_that_dies_starting_up_is_replaced_at_its_trial(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The first setup kills its process; the trial gets a fresh worker, which sets up fine."""
    marker = tmp_path / "died-once"
    result = _run(cli, f"objective.setup={OBJECTIVES}:setup_dies_once", "scheduler.parallel=1",
                  "study.n_trials=2",
                  env={"HPO_TEST_SETUP_NOTES": str(marker), "HPO_TEST_STEP_S": "0.05"})
    assert result.code == 0, result.stderr
    assert marker.exists()  # the first worker's setup did die
    rows = trial_rows(result.db)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 2
    assert rows[0]["attrs"]["hpo.worker_trial"] == 1  # a new worker, not the dead one's slot


def test_a_hanging_setup_is_timed_from_its_workers_start_and_its_output_is_the_trials_log(  # type: ignore[no-untyped-def]
        cli, tmp_path: Path) -> None:
    """Issue 28, item 6: the first wave's wait ends at trial_timeout_s, and the trial it then
    hands over is timed from its worker's start (setup included): FAIL timeout saying so;
    its printed log exists and holds the setup's output, which ``logs 0`` shows (it was left
    in spare-slot0.log, and ``logs 0`` said the log was on another host)."""
    result = _run(cli, f"objective.setup={OBJECTIVES}:hanging_setup", "scheduler.parallel=1",
                  "study.n_trials=1", "scheduler.trial_timeout_s=5", "scheduler.kill_grace_s=1")
    assert result.code == 1, result.stderr
    (row,) = trial_rows(result.db)
    attrs = row["attrs"]
    assert row["state"] == "FAIL" and attrs["hpo.fail_reason"] == "timeout", attrs
    assert "objective.setup still running" in attrs["hpo.error"]
    assert attrs["hpo.setup_running"] is False  # it was true while the trial ran
    # Its clock is the loop's: not stopped before its 5 s, setup included. That the wait is
    # not given back to it as a stall of the loop (which let it run 5 s more) is
    # tests/scheduler/test_first_wave_ready.py's, in-process: no bound on a duration here, which a
    # loaded machine stretches.
    duration = datetime.fromisoformat(row["end"]) - datetime.fromisoformat(row["start"])
    assert duration.total_seconds() >= 5.0, duration
    log = Path(attrs["hpo.log_path"])
    assert log.name == "trial-0.log" and "setup: fetching the data" in log.read_text()
    assert not list(log.parent.glob("spare-slot*.log"))
    shown = cli("logs", "0")
    assert shown.code == 0 and "setup: fetching the data" in shown.stdout, shown.stderr
