"""The orchestrator's signals (issue 15): SIGTERM and SIGHUP at any moment of a run, start-up
included, stop it with exit 130 and nothing RUNNING; a KeyboardInterrupt the objective raises
is its own failure, not a kill; trials the run stops say why.

Whole studies in real processes (slow).
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import rows_while_running as _rows
from tests.conftest import run_cli, start_cli, trial_rows

pytestmark = pytest.mark.slow

MISBEHAVE = "objective.target=tests.misbehaving:misbehave"

# An objective whose import, in the orchestrator's start-up check (runner.check_objective),
# says so and then takes long: a signal sent then reaches the run before its loop exists.
SLOW_START = """
import os, pathlib, time
if "HPO_SLOT" not in os.environ:  # the orchestrator, not a trial's child
    pathlib.Path("starting").touch()
    time.sleep(float(os.environ.get("HPO_TEST_START_S", "60")))

def objective(trial):
    return trial.suggest_float("x", 0.0, 1.0)
"""


def _suggested(tmp_path: Path) -> bool:
    """Has a trial of the study suggested its params yet?"""
    try:
        with sqlite3.connect(tmp_path / "hpo.db") as con:
            return con.execute("SELECT COUNT(*) FROM trial_params").fetchone()[0] > 0
    except sqlite3.Error:  # not created yet
        return False


def _wait_for(condition: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.1)


def _stop(proc: Any, sig: int) -> tuple[str, str]:
    try:
        proc.send_signal(sig)
        return proc.communicate(timeout=120)  # type: ignore[no-any-return]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_start_up_exits_130_like_a_stopped_run(tmp_path: Path, sig: int) -> None:
    (tmp_path / "slowstart.py").write_text(SLOW_START)
    proc = start_cli(tmp_path, "run", "objective=custom", "objective.target=slowstart:objective",
                     "study.n_trials=2")
    _wait_for(lambda: (tmp_path / "starting").exists() or proc.poll() is not None)
    out, err = _stop(proc, sig)
    assert proc.returncode == 130, (out, err)
    assert "stopped before the first trial started" in out and "Traceback" not in err, (out, err)
    assert "marked FAIL" not in out
    assert not [r for r in _rows(tmp_path) if r["state"] == "RUNNING"]


def test_sighup_stops_running_trials_like_sigterm(tmp_path: Path) -> None:
    """The terminal closed: the run stops as on Ctrl-C, its trials FAIL interrupted."""
    proc = start_cli(tmp_path, "run", "objective=custom", MISBEHAVE, "pruner=none",
                     "study.n_trials=4", "scheduler.parallel=2", "scheduler.kill_grace_s=2",
                     env={"HPO_TEST_MISBEHAVE": "sleep"})
    _wait_for(lambda: len([r for r in _rows(tmp_path) if "hpo.pid" in r["attrs"]]) == 2)
    out, err = _stop(proc, signal.SIGHUP)
    assert proc.returncode == 130, (out, err)
    rows = _rows(tmp_path)
    assert not [r for r in rows if r["state"] == "RUNNING"]
    ran = [r for r in rows if "hpo.pid" in r["attrs"]]
    assert [r["attrs"]["hpo.fail_reason"] for r in ran] == ["interrupted"] * 2
    assert all(not psutil.pid_exists(r["attrs"]["hpo.pid"]) for r in ran)


def test_keyboard_interrupt_raised_by_the_objective_is_its_exception(tmp_path: Path) -> None:
    """Not a kill: the objective's own code raised it, so it is not retried."""
    result = run_cli(tmp_path, "run", "objective=custom", MISBEHAVE, "pruner=none",
                     "sampler=random", "study.n_trials=2", "scheduler.parallel=1",
                     env={"HPO_TEST_MISBEHAVE": "keyboard_interrupt,ok"})
    assert result.code == 0, result.stderr
    rows = sorted(trial_rows(result.db), key=lambda r: r["number"])
    assert [r["state"] for r in rows] == ["FAIL", "COMPLETE"]
    attrs = rows[0]["attrs"]
    assert attrs["hpo.fail_reason"] == "exception", attrs.get("hpo.error")
    assert attrs["hpo.error"] == "KeyboardInterrupt: raised by the objective"
    assert "hpo.retried" not in attrs


def test_a_sigint_sent_to_a_trial_is_a_kill_not_its_exception(tmp_path: Path) -> None:
    """The other side: SIGINT from outside stopped the trial (killed, retried)."""
    proc = start_cli(tmp_path, "run", "objective=custom", MISBEHAVE, "pruner=none",
                     "study.n_trials=1", "scheduler.parallel=1", "scheduler.max_retries=1",
                     env={"HPO_TEST_MISBEHAVE": "sleep"})
    try:
        _wait_for(lambda: any("hpo.pid" in r["attrs"] for r in _rows(tmp_path)))
        (first,) = _rows(tmp_path)
        psutil.Process(first["attrs"]["hpo.pid"]).send_signal(signal.SIGINT)
        _wait_for(lambda: any(r["state"] == "FAIL" for r in _rows(tmp_path)))
    finally:
        _stop(proc, signal.SIGTERM)
    failed = next(r for r in _rows(tmp_path) if r["number"] == 0)
    assert failed["attrs"]["hpo.fail_reason"] == "killed", failed["attrs"].get("hpo.error")
    assert failed["attrs"]["hpo.retried"] is True


def test_trials_the_failure_policy_stops_say_why(tmp_path: Path) -> None:
    """study.fail_fast stops the run: the trial it stopped records the policy, not a signal."""
    result = run_cli(tmp_path, "run", "objective=custom", MISBEHAVE, "pruner=none",
                     "sampler=random", "study.n_trials=10", "scheduler.parallel=2",
                     "study.fail_fast=2", "scheduler.prefetch=0", "scheduler.kill_grace_s=2",
                     env={"HPO_TEST_MISBEHAVE": "sleep,raise,raise,raise"})
    assert result.code == 1, result.stdout + result.stderr
    rows = {r["number"]: r for r in trial_rows(result.db)}
    stopped = rows[0]["attrs"]
    assert stopped["hpo.fail_reason"] == "interrupted"
    assert stopped["hpo.error"].startswith("stopped by study.fail_fast: the first 2 trials all "
                                           "failed with the same error"), stopped["hpo.error"]
    assert "SIGTERM" not in stopped["hpo.error"]


def test_a_trial_reaped_by_a_partner_is_stopped_without_waiting_for_its_next_write(
        tmp_path: Path) -> None:
    """A partner failed our trial (as after a SIGSTOP past the grace period) while its child
    computes without a word to us: the heartbeat round notices, stops the child, and the run
    goes on (before: the trial ran until its next write, here never)."""
    import optuna
    from optuna.trial import TrialState

    proc = start_cli(tmp_path, "run", "objective=custom", MISBEHAVE, "pruner=none",
                     "sampler=random", "study.n_trials=2", "scheduler.parallel=1",
                     "storage.heartbeat_interval_s=1", env={"HPO_TEST_MISBEHAVE": "sleep,ok"})
    try:
        # after its last write (the suggest): from then on only the heartbeat round can tell
        _wait_for(lambda: _suggested(tmp_path))
        (row,) = [r for r in _rows(tmp_path) if "hpo.pid" in r["attrs"]]
        partner = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'hpo.db'}")
        partner.set_trial_state_values(row["trial_id"], TrialState.FAIL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (out, err)
    rows = {r["number"]: r for r in _rows(tmp_path)}
    assert not psutil.pid_exists(row["attrs"]["hpo.pid"])
    assert rows[0]["state"] == "FAIL" and "hpo.fail_reason" not in rows[0]["attrs"]  # the partner's record
    assert rows[1]["state"] == "COMPLETE"


def test_a_rerun_sweeps_what_a_killed_runs_trials_left_running(tmp_path: Path) -> None:
    """kill -9 of the orchestrator: its worker dies with it, but the worker's own child
    (which ignores SIGTERM) goes to init. The next run of the study kills it at its start,
    found by the pids and creation times the killed run recorded."""
    args = ("run", "objective=custom", MISBEHAVE, "pruner=none", "sampler=random",
            "study.n_trials=1", "scheduler.parallel=1")
    env = {"HPO_TEST_MISBEHAVE": "ignore_term,ok"}
    records = tmp_path / "hpo-runs" / "hpo"
    proc = start_cli(tmp_path, *args, env=env)
    leftover: list[int] = []
    try:
        _wait_for(lambda: any("test.grandchildren" in r["attrs"] for r in _rows(tmp_path)))
        (row,) = _rows(tmp_path)
        leftover = row["attrs"]["test.grandchildren"]
        _wait_for(lambda: any(str(leftover[0]) in p.read_text()
                              for p in records.glob("processes-*.json")))
        proc.kill()
        proc.communicate()
        _wait_for(lambda: not _alive(row["attrs"]["hpo.pid"]))  # the worker: PR_SET_PDEATHSIG
        assert _alive(leftover[0])  # init's now
        rerun = run_cli(tmp_path, *args, env=env)  # trial 0 is retried as trial 1 ('ok')
        assert rerun.code == 0, rerun.stderr
        _wait_for(lambda: not _alive(leftover[0]), timeout=30)
        assert not list(records.glob("processes-*.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in leftover:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.long
def test_sigint_stops_gracefully(tmp_path: Path) -> None:
    proc = start_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.objectives:sleepy",
                     "scheduler.parallel=2", "study.n_trials=6", "scheduler.kill_grace_s=2",
                     env={"HPO_TEST_SLEEP_S": "60"})
    db = tmp_path / "hpo.db"
    running: list[dict[str, Any]] = []
    # The event itself, not a second's sleep: two trials on their slots (their pids recorded)
    # and a third asked ahead of a free slot (scheduler.prefetch=1), RUNNING without a pid.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        running = [r for r in _rows(tmp_path) if r["state"] == "RUNNING"]
        if len(running) == 3 and sum("hpo.pid" in r["attrs"] for r in running) == 2:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"never two trials on slots and one asked ahead: {running}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    rows = trial_rows(db)
    failed = [r for r in rows if r["state"] == "FAIL"]
    assert all(r["attrs"]["hpo.fail_reason"] == "interrupted" for r in failed)
    # scheduler.prefetch=1: a third trial was asked ahead of a free slot; it is not left
    # RUNNING, nor failed: it never ran, and goes back to the queue itself, with no start
    assert len(failed) == 2
    waiting = [r for r in rows if r["state"] == "WAITING"]
    assert [r["start"] for r in waiting if "hpo.retry_of" not in r["attrs"]] == [None]
    # each goes back to the queue for the next run (tests/scheduler/test_reliability_storage.py)
    assert sorted(r["attrs"]["hpo.retry_of"] for r in waiting if "hpo.retry_of" in r["attrs"]) \
        == sorted(r["number"] for r in failed)
