"""Trials finished or made outside the run (issue 28, item 8): ``optuna tell`` on a trial the
run is running is reported from the row it wrote, not as a reaping; a trial ``optuna ask``
made is left to its maker (no run reaps, retries or waits for it), ``status`` shows it as
``outside``, and the finished count never passes the budget."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo_orchestrator.db import RunningTrialRow
from hpo_orchestrator.keys import asked_outside
from tests.conftest import rows_while_running, run_cli, start_cli, trial_rows

TARGET = "objective.target=tests.misbehaving:misbehave"
STORAGE = "sqlite:///{}"


def _wait_for(condition: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.2)


def test_a_trial_without_any_orchestrator_attr_or_heartbeat_is_outside() -> None:
    assert asked_outside({}, beats=False)
    assert not asked_outside({}, beats=True)  # Optuna's own heartbeat: its stale check holds
    for key in ("hpo.host", "hpo.pid", "hpo.orchestrator_pid", "hpo.retry_of"):
        assert not asked_outside({key: 1}, beats=False), key
    row = RunningTrialRow(1, None, None, None, None, None, None)
    assert row.outside
    assert not RunningTrialRow(1, None, None, None, "h", None, 7).outside


@pytest.mark.slow
def test_optuna_tell_on_a_running_trial_is_reported_from_its_row(tmp_path: Path) -> None:
    """Was: "FAIL lost: reaped by another orchestrator while this one was stopped", while the
    database rightly held COMPLETE 123.0."""
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET, "pruner=none",
                     "sampler=random", "study.n_trials=1", "storage.heartbeat_interval_s=1",
                     env={"HPO_TEST_MISBEHAVE": "sleep"})
    try:
        _wait_for(lambda: any(r["state"] == "RUNNING" and "hpo.pid" in r["attrs"]
                              for r in rows_while_running(tmp_path)))
        study = optuna.load_study(study_name="hpo",
                                  storage=STORAGE.format(tmp_path / "hpo.db"))
        study.tell(0, 123.0)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    (row,) = trial_rows(tmp_path / "hpo.db")
    assert row["state"] == "COMPLETE" and "hpo.fail_reason" not in row["attrs"], row
    assert "reaped by another orchestrator" not in out
    assert "finished outside this run" in out and "COMPLETE 123" in out, out


@pytest.mark.slow
def test_a_trial_optuna_ask_made_is_left_to_its_maker(tmp_path: Path) -> None:
    """Was: reaped as lost by the next run after the grace period, retried, and the study
    reported "finished 7 of 6"."""
    common = ("run", "objective=custom", TARGET, "pruner=none", "sampler=random",
              "storage.heartbeat_interval_s=1", "storage.grace_period_s=2")
    first = run_cli(tmp_path, *common, "study.n_trials=2", env={"HPO_TEST_MISBEHAVE": "ok"})
    assert first.code == 0, first.stderr
    study = optuna.load_study(study_name="hpo", storage=STORAGE.format(first.db))
    asked = study.ask()  # as `optuna ask` does: RUNNING, no hpo.* attr, no heartbeat
    second = run_cli(tmp_path, *common, "study.n_trials=4", env={"HPO_TEST_MISBEHAVE": "ok"})
    assert second.code == 0, second.stderr
    # claimed by the study, not done: the header and the bar count what status calls finished
    assert "n_trials 4 (2 done before, 1 running elsewhere" in second.stdout, second.stdout
    assert "3/4 this run" in second.stdout and "finished 3 of 4" in second.stdout, second.stdout
    rows = {r["number"]: r for r in trial_rows(first.db)}
    assert rows[asked.number]["state"] == "RUNNING" and not rows[asked.number]["attrs"]
    assert not [r for r in rows.values() if r["attrs"].get("hpo.fail_reason") == "lost"]
    assert sorted(r["state"] for r in rows.values()) == ["COMPLETE"] * 3 + ["RUNNING"]
    status = run_cli(tmp_path, "status")
    assert status.code == 0, status.stderr
    assert "finished 3 of 4" in status.stdout and "outside" in status.stdout, status.stdout
    study.tell(asked, 1.0)  # its maker finishes it: the budget is full, never passed
    status = run_cli(tmp_path, "status")
    assert "finished 4 of 4" in status.stdout, status.stdout
    study.tell(study.ask(), 2.0)  # and one more, past the budget
    status = run_cli(tmp_path, "status")
    assert "finished 4 of 4 (+1 more" in status.stdout, status.stdout


def test_reaping_leaves_a_trial_outside_alone_and_fails_one_that_never_beat() -> None:
    """Recovery._lost: a trial started long ago that never beat is lost when an orchestrator
    asked it (its hpo.* attrs), left alone when none did."""
    from datetime import datetime, timedelta

    from hpo_orchestrator.scheduler._recovery import Recovery

    recovery = object.__new__(Recovery)
    recovery.grace_s, recovery.host = 30.0, "here"
    long_ago = datetime.now() - timedelta(hours=1)
    cutoff = datetime.now() - timedelta(seconds=30)
    outside = RunningTrialRow(1, long_ago, None, None, None, None, None)
    ours_once = RunningTrialRow(2, long_ago, None, None, None, None, None, retry_of=0)
    assert not recovery._lost(outside, set(), cutoff)
    assert recovery._lost(ours_once, set(), cutoff)


def test_a_trial_ends_at_its_childs_own_time_kept_within_its_spawn_and_now() -> None:
    from types import SimpleNamespace

    from hpo_orchestrator.scheduler import RunningTrial
    from hpo_orchestrator.worker import TrialOutcome

    def ended(child_end: float | None) -> float:
        rt = SimpleNamespace(outcome=TrialOutcome(kind="value", value=1.0, ended=child_end),
                             spawned_epoch=100.0, timed_out_epoch=None)
        return RunningTrial.ended_epoch(rt, 170.4)  # type: ignore[arg-type]

    assert ended(100.5) == 100.5  # the loop read it 70 s later
    assert ended(None) == 170.4
    assert ended(50.0) == 100.0 and ended(1e12) == 170.4  # whatever a child says
