"""What a trial's process can do to the orchestrator (issue 15): bad frames, threads, a
partner that reaps while we are stopped, ``hpo.*`` writes, grandchildren. Whatever a trial
does fails that trial alone, with the right reason; the orchestrator carries on.

Whole studies with the misbehaving objectives of tests.misbehaving; the
pipe's unit tests are in tests/scheduler/test_channel.py.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import rows_while_running as _rows
from tests.conftest import run_cli, start_cli, trial_rows

TARGET = "objective.target=tests.misbehaving:"


# --- whole studies -----------------------------------------------------------------------

def _misbehave(tmp_path: Path, modes: str, *args: str, timeout: float = 240) -> Any:
    return run_cli(tmp_path, "run", "objective=custom", TARGET + "misbehave", "pruner=none",
                   "sampler=random", *args, env={"HPO_TEST_MISBEHAVE": modes}, timeout=timeout)


def _by_number(db: Path) -> dict[int, dict[str, Any]]:
    return {r["number"]: r for r in trial_rows(db)}


@pytest.mark.long
@pytest.mark.slow
def test_bad_frames_fail_only_their_trial_and_replace_the_worker(tmp_path: Path) -> None:
    modes = "junk,oversized,unpicklable,runs_code,ok,partial,ok,ok"
    result = _misbehave(tmp_path, modes, "study.n_trials=8", "scheduler.parallel=2",
                        "scheduler.worker_mode=reuse", "scheduler.kill_grace_s=1")
    assert result.code == 0, result.stderr
    trials = _by_number(result.db)
    assert sorted(trials) == list(range(8))
    for number, mode in enumerate(modes.split(",")):
        row = trials[number]
        if mode == "ok":
            assert row["state"] == "COMPLETE", row
            continue
        assert row["state"] == "FAIL", row
        assert row["attrs"]["hpo.fail_reason"] == "exception"
        assert row["attrs"]["hpo.error"].startswith("protocol: "), row["attrs"]["hpo.error"]
        assert "hpo.retried" not in row["attrs"]  # the objective's fault: not retried
        # its worker was replaced: no other trial ran in that process
        pid = row["attrs"]["hpo.pid"]
        assert [t["number"] for t in trials.values() if t["attrs"]["hpo.pid"] == pid] == [number]


@pytest.mark.slow
def test_a_thread_the_objective_leaves_running_does_not_hold_a_fresh_trial(tmp_path: Path) -> None:
    """In a fresh child the trial ends when the process does, and Python waits for every
    thread that is no daemon: one the objective left running stalled the run for good, or,
    with trial_timeout_s, lost the value it had returned to a 'timeout'. The child gives such
    threads THREADS_GRACE_S, then leaves; the timeout counts only until the result is in."""
    result = _misbehave(tmp_path, "lingering_thread", "study.n_trials=2", "scheduler.parallel=2",
                        "scheduler.worker_mode=fresh", "scheduler.trial_timeout_s=3", timeout=120)
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"], rows


@pytest.mark.slow
def test_each_trial_of_a_reused_worker_starts_in_the_same_folder(tmp_path: Path) -> None:
    """A trial that changed folder left the next one on its worker there (files written
    into sub0/sub2/...)."""
    result = _misbehave(tmp_path, "wanders", "study.n_trials=3", "scheduler.parallel=1",
                        "scheduler.worker_mode=reuse")
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert {r["attrs"]["hpo.worker_trial"] for r in rows} == {1, 2, 3}  # one worker, in turn
    assert [r["attrs"]["test.cwd"] for r in rows] == [str(tmp_path)] * 3


@pytest.mark.slow
def test_a_half_written_frame_still_times_out(tmp_path: Path) -> None:
    """The trial writes half a frame, ignores SIGTERM and sleeps: the timeout still fires."""
    result = _misbehave(tmp_path, "partial", "study.n_trials=1", "scheduler.trial_timeout_s=3",
                        "scheduler.kill_grace_s=1", timeout=90)
    # Its only trial failed: the failure policy ends such a run with exit 1 (study.fail_fast)
    assert result.code == 1 and "every trial of this run failed" in result.stderr, result.stderr
    (row,) = trial_rows(result.db)
    assert row["state"] == "FAIL" and row["attrs"]["hpo.fail_reason"] == "timeout"


def test_a_timed_out_trial_ends_at_its_limit_not_after_the_grace_or_a_pause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """trial_timeout_s=2 and a loop that stood still 30 s (SIGSTOP) meanwhile: the timeout
    fires once the trial has run 2 s of the loop's time, and the trial ends there, however
    long its process then takes to die (SIGTERM's grace) and whatever the wall clock says."""
    from types import SimpleNamespace

    from hpo_orchestrator.scheduler import RunningTrial, _deadlines

    signalled: list[int] = []
    monkeypatch.setattr(_deadlines, "signal_tree", lambda pid, sig: signalled.append(sig))
    now = time.monotonic()
    rt = SimpleNamespace(spawned_at=now - 32.5, spawned_epoch=1000.0, paused_s=30.0,
                         stop_reason=None, outcome=None, in_setup=False, kill_at=None,
                         timed_out_epoch=None, process=SimpleNamespace(pid=-1))
    _deadlines.enforce_deadlines([rt], timeout_s=3.0, kill_grace_s=5.0)  # 2.5 s run: not yet
    assert rt.stop_reason is None and not signalled
    _deadlines.enforce_deadlines([rt], timeout_s=2.0, kill_grace_s=5.0)
    assert rt.stop_reason == "timeout" and signalled
    assert rt.timed_out_epoch == pytest.approx(1002.5, abs=0.05)
    # read once its process died after the grace, 38 s of wall time after the spawn
    assert RunningTrial.ended_epoch(rt, 1038.0) == pytest.approx(1002.5, abs=0.05)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_trial_that_ignores_sigterm_is_recorded_as_running_until_its_timeout(
        tmp_path: Path) -> None:
    """trial_timeout_s=2, and the trial ignores SIGTERM, so it dies at SIGKILL after
    kill_grace_s=4: its recorded duration (the datetimes status, report and SQL read, and the
    progress line) is its 2 s of running, not 6 s with the grace."""
    result = _misbehave(tmp_path, "ignore_term", "study.n_trials=1", "scheduler.trial_timeout_s=2",
                        "scheduler.kill_grace_s=4", timeout=90)
    (row,) = trial_rows(result.db)
    assert row["attrs"]["hpo.fail_reason"] == "timeout", row
    start, end = (datetime.fromisoformat(row[k]) for k in ("start", "end"))
    assert 2.0 <= (end - start).total_seconds() < 3.0, (start, end)
    assert re.search(r"trial +0 FAIL +cpu0 +2\.\ds +timeout", result.stdout), result.stdout


@pytest.mark.slow
def test_sigterm_stops_a_run_whose_child_wrote_half_a_frame(tmp_path: Path) -> None:
    """SIGTERM once the child has written its half frame (it says so in a notes file), not
    after a fixed sleep that may come before it: the loop, holding an unfinished frame, still
    stops the trial and the run (exit 130)."""
    notes = tmp_path / "partial-written"
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "misbehave", "pruner=none",
                     "study.n_trials=2", "scheduler.kill_grace_s=1",
                     env={"HPO_TEST_MISBEHAVE": "partial", "HPO_TEST_PARTIAL_NOTES": str(notes)})
    try:
        _wait_for(lambda: notes.exists() and notes.read_text().endswith("\n"))
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    rows = _rows(tmp_path)
    assert "RUNNING" not in {r["state"] for r in rows}
    # interrupted trials go back to the queue as WAITING retries (issue 15: re-run, not spent)
    assert {r["attrs"].get("hpo.fail_reason") for r in rows if r["state"] != "WAITING"} <= {"interrupted"}


@pytest.mark.slow
def test_threads_in_a_trial_get_their_own_replies_in_reuse_mode(tmp_path: Path) -> None:
    modes = "threads,ok,stray_thread,ok,ok"
    result = _misbehave(tmp_path, modes, "study.n_trials=5", "scheduler.parallel=1",
                        "scheduler.worker_mode=reuse")
    assert result.code == 0, result.stderr
    trials = _by_number(result.db)
    assert [trials[n]["state"] for n in range(5)] == ["COMPLETE"] * 5, \
        [trials[n]["attrs"].get("hpo.error") for n in range(5)]
    blobs = {k: v for k, v in trials[0]["attrs"].items() if k.startswith("test.blob")}
    assert len(blobs) == 12 and all(v == k[9] * 40_000 for k, v in blobs.items())
    # the trial after the threads ran in the same process: nothing was left over
    assert trials[1]["attrs"]["hpo.pid"] == trials[0]["attrs"]["hpo.pid"]


@pytest.mark.slow
def test_a_reply_a_trial_never_read_reaches_neither_its_calls_nor_the_next_trial(
        tmp_path: Path) -> None:
    """Issue 28, item 7: trials 0 and 2 write a call frame to their pipe themselves and never
    read the reply. The next trial in the same worker (which took the stale reply for its
    job, failing with "'tuple' object has no attribute 'log_path'" and its traceback in
    trial 0's log) completes, and trial 2's next proxied call gets its own reply."""
    result = _misbehave(tmp_path, "unread_call,ok,unread_call_then_suggest,ok",
                        "study.n_trials=4", "scheduler.parallel=1", "scheduler.worker_mode=reuse",
                        timeout=120)
    assert result.code == 0, result.stderr
    trials = _by_number(result.db)
    assert [trials[n]["state"] for n in range(4)] == ["COMPLETE"] * 4, \
        [trials[n]["attrs"].get("hpo.error") for n in range(4)]
    assert len({trials[n]["attrs"]["hpo.pid"] for n in range(4)}) == 1  # one worker throughout
    assert "Traceback" not in Path(trials[0]["attrs"]["hpo.log_path"]).read_text()


@pytest.mark.slow
def test_hpo_attrs_from_an_objective_are_refused_and_the_budget_holds(tmp_path: Path) -> None:
    result = _misbehave(tmp_path, "hpo_attr,hpo_attr_raw,ok", "study.n_trials=3",
                        "scheduler.parallel=1", timeout=120)
    assert result.code == 0, result.stderr
    trials = _by_number(result.db)
    assert sorted(trials) == [0, 1, 2]
    for number in (0, 1):
        attrs = trials[number]["attrs"]
        assert trials[number]["state"] == "FAIL" and attrs["hpo.fail_reason"] == "exception"
        assert "hpo.retried" in attrs["hpo.error"] and "orchestrator's" in attrs["hpo.error"]
        assert "hpo.retried" not in attrs
    assert trials[2]["state"] == "COMPLETE"


# --- a paused orchestrator -----------------------------------------------------------------

def _params(db: Path, row: dict[str, Any]) -> set[str]:
    import sqlite3

    with sqlite3.connect(db) as con:
        return {name for (name,) in con.execute(
            "SELECT param_name FROM trial_params WHERE trial_id = ?", (row["trial_id"],))}


def _reached(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def _wait_for(condition: Any, timeout: float = 120) -> None:
    if not _reached(condition, timeout):
        raise AssertionError("condition not reached")


def _stop_for(proc: Any, seconds: float) -> None:
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGCONT)


@pytest.mark.long
@pytest.mark.slow
def test_a_stopped_orchestrator_does_not_time_out_its_trials(tmp_path: Path) -> None:
    """SIGSTOP for longer than trial_timeout_s: the trial waited for us, it did not run."""
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "stopwatch", "pruner=none",
                     "study.n_trials=1", "scheduler.trial_timeout_s=20",
                     env={"HPO_TEST_STEPS": "6", "HPO_TEST_STEP_S": "0.5"})
    try:
        _wait_for(lambda: any(r["state"] == "RUNNING" for r in _rows(tmp_path)))
        _stop_for(proc, 25)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    (row,) = _rows(tmp_path)
    assert row["state"] == "COMPLETE", row["attrs"].get("hpo.error")


@pytest.mark.slow
def test_a_trial_ends_when_its_objective_returned_not_when_the_result_was_read(
        tmp_path: Path) -> None:
    """Issue 28, item 12: the objective's last act stops the orchestrator, which stays
    stopped for 3 s before it reads the result; the trial's recorded duration (the datetimes
    status and report read, and the progress line) is the child's, not 3 s more (a 0.5 s
    trial was recorded as 70.4 s after a storage outage)."""
    notes = tmp_path / "stopped"
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "misbehave", "pruner=none",
                     "sampler=random", "study.n_trials=1",
                     env={"HPO_TEST_MISBEHAVE": "stop_orchestrator",
                          "HPO_TEST_STOP_NOTES": str(notes)})
    try:
        _wait_for(notes.exists)
        _wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED)
        stopped_at = datetime.now()  # Optuna stores local time; the objective has returned
        time.sleep(3.0)  # the pause whose length must not reach the trial's duration
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    (row,) = _rows(tmp_path)
    assert row["state"] == "COMPLETE", row["attrs"].get("hpo.error")
    start, end = datetime.fromisoformat(row["start"]), datetime.fromisoformat(row["end"])
    assert end <= stopped_at, (start, end, stopped_at)
    shown = re.search(r"trial\s+0 COMPLETE\s+\S+\s+([\d.]+)s", out)
    assert shown and float(shown.group(1)) <= (stopped_at - start).total_seconds() + 0.1, out


@pytest.mark.long
@pytest.mark.slow
def test_a_paused_orchestrator_survives_its_partner_reaping_its_trial(tmp_path: Path) -> None:
    """Two orchestrators on one study; one is stopped past the heartbeat grace, its partner
    reaps its trial ('lost', retried); resumed, it drops that trial and finishes the study."""
    common = ("run", "objective=custom", TARGET + "stopwatch", "pruner=none", "study.n_trials=6",
              "scheduler.parallel=1", "storage.heartbeat_interval_s=1",
              "storage.grace_period_s=3")
    env = {"HPO_TEST_STEPS": "10", "HPO_TEST_STEP_S": "0.5"}
    paused = start_cli(tmp_path, *common, "scheduler.host=paused",
                       f"scheduler.lease_dir={tmp_path / 'leases-a'}", env=env)
    partner = None
    try:
        _wait_for(lambda: any(r["state"] == "RUNNING" for r in _rows(tmp_path)))
        partner = start_cli(tmp_path, *common, "scheduler.host=partner",
                            f"scheduler.lease_dir={tmp_path / 'leases-b'}", env=env)
        _wait_for(lambda: len(_rows(tmp_path)) > 0 and any(
            "partner" == r["attrs"].get("hpo.host") for r in _rows(tmp_path)), timeout=120)
        for _ in range(5):  # stopped while writing, it holds sqlite's lock: try another moment
            paused.send_signal(signal.SIGSTOP)
            try:
                if _reached(lambda: any(r["attrs"].get("hpo.fail_reason") == "lost"
                                        for r in _rows(tmp_path)), timeout=20):
                    break
            finally:
                paused.send_signal(signal.SIGCONT)
            time.sleep(0.5)
        _out_a, err_a = paused.communicate(timeout=180)
        _out_b, err_b = partner.communicate(timeout=180)
    finally:
        for proc in (paused, partner):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert paused.returncode == 0, err_a
    assert partner.returncode == 0, err_b
    rows = _rows(tmp_path)
    assert not [r for r in rows if r["state"] == "RUNNING"]
    lost = [r for r in rows if r["attrs"].get("hpo.fail_reason") == "lost"]
    # (one asked ahead and reaped before a slot took it has no hpo.host: it was ours too)
    assert lost and all(r["attrs"].get("hpo.host", "paused") == "paused" for r in lost)
    assert all(r["state"] == "FAIL" and r["attrs"].get("hpo.retried") for r in lost)
    retried = {r["attrs"]["hpo.retry_of"] for r in rows if "hpo.retry_of" in r["attrs"]}
    assert retried == {r["number"] for r in lost}
    assert len([r for r in rows if r["state"] == "COMPLETE"]) == 6


# --- grandchildren --------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reuse", "fresh"])
def test_grandchildren_do_not_outlive_the_run(tmp_path: Path, mode: str) -> None:
    result = _misbehave(tmp_path, "grandchildren,ok", "study.n_trials=2", "scheduler.parallel=1",
                        f"scheduler.worker_mode={mode}")
    assert result.code == 0, result.stderr
    pids = _by_number(result.db)[0]["attrs"]["test.grandchildren"]
    assert len(pids) == 3
    _wait_for(lambda: not any(_alive(p) for p in pids), timeout=30)


@pytest.mark.slow
def test_workers_die_with_a_killed_orchestrator_even_ignoring_sigterm(tmp_path: Path) -> None:
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "misbehave", "pruner=none",
                     "study.n_trials=1", env={"HPO_TEST_MISBEHAVE": "ignore_term"})
    grandchildren: list[int] = []
    try:
        _wait_for(lambda: any("test.grandchildren" in r["attrs"] for r in _rows(tmp_path)))
        (row,) = _rows(tmp_path)
        grandchildren = row["attrs"]["test.grandchildren"]
        proc.kill()
        proc.communicate()
        worker = row["attrs"]["hpo.pid"]
        _wait_for(lambda: not _alive(worker), timeout=30)  # PR_SET_PDEATHSIG: SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in grandchildren:  # init's until a next run of the study (tests/scheduler/test_signals.py)
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@pytest.mark.slow
def test_chaos_every_misbehaving_trial_fails_alone_with_its_reason(tmp_path: Path) -> None:
    """One study, a different misbehaviour per trial: the run ends with exit 0, every
    misbehaving trial that must fail fails with its reason, the others complete."""
    expected = {  # mode: (state, fail_reason, start of hpo.error)
        "junk": ("FAIL", "exception", "protocol: "),
        "threads": ("COMPLETE", None, None),
        "runs_code": ("FAIL", "exception", "protocol: "),
        "grandchildren": ("COMPLETE", None, None),
        "hpo_attr": ("FAIL", "exception", "ValueError: trial.set_user_attr('hpo.retried')"),
        "oversized": ("FAIL", "exception", "protocol: "),
        "stray_thread": ("COMPLETE", None, None),
        "hpo_attr_raw": ("FAIL", "exception", "ValueError: trial.set_user_attr('hpo.retried')"),
        "unpicklable": ("FAIL", "exception", "protocol: "),
        "ok": ("COMPLETE", None, None),
    }
    modes = list(expected)
    result = _misbehave(tmp_path, ",".join(modes), f"study.n_trials={len(modes)}",
                        "scheduler.parallel=2", "scheduler.worker_mode=reuse",
                        "scheduler.kill_grace_s=1", timeout=300)
    assert result.code == 0, result.stderr
    trials = _by_number(result.db)
    assert sorted(trials) == list(range(len(modes)))
    for number, mode in enumerate(modes):
        state, reason, error = expected[mode]
        attrs = trials[number]["attrs"]
        assert (trials[number]["state"], attrs.get("hpo.fail_reason")) == (state, reason), \
            (mode, attrs.get("hpo.error"))
        if error is not None:
            assert attrs["hpo.error"].startswith(error), (mode, attrs["hpo.error"])
    leftover = _by_number(result.db)[modes.index("grandchildren")]["attrs"]["test.grandchildren"]
    _wait_for(lambda: not any(_alive(p) for p in leftover), timeout=30)


@pytest.mark.slow
def test_an_orphan_started_right_before_the_trial_returns_is_killed_at_its_end(
        tmp_path: Path) -> None:
    """A reuse worker is a child subreaper: a process its trial double-forks as its last act
    is still its child when the trial ends, so the orchestrator's walk is not skipped and the
    process is killed at that trial's end (seen by the next trial in the same process), then
    collected by the worker."""
    result = _misbehave(tmp_path, "ok,fork_at_end,left_gone,left_gone", "study.n_trials=4",
                        "scheduler.parallel=1", "scheduler.worker_mode=reuse")
    assert result.code == 0, result.stderr
    trials = _by_number(result.db)
    assert len({t["attrs"]["hpo.pid"] for t in trials.values()}) == 1  # one worker ran them all
    (orphan,) = trials[1]["attrs"]["test.grandchildren"]
    assert trials[2]["attrs"]["test.left_running"] == []
    assert trials[3]["attrs"]["test.left_existing"] == []
    assert not _alive(orphan)


@pytest.mark.slow
def test_a_trial_that_signals_its_process_group_reaches_only_its_own(tmp_path: Path) -> None:
    """kill(0, SIGTERM) and killpg(getpgrp(), SIGTERM) from a trial: its worker has a session
    and process group of its own, so the orchestrator is not in that group and the run goes
    on (in the orchestrator's group, the run stopped as on Ctrl-C, exit 130)."""
    import subprocess
    import sys

    from tests.conftest import cli_env

    run = subprocess.run(  # a session of its own: pytest is not in the group either way
        [sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
         TARGET + "misbehave", "pruner=none", "sampler=random", "study.n_trials=2",
         "scheduler.parallel=1", "scheduler.gpus=none"], cwd=tmp_path, capture_output=True,
        text=True, timeout=240, start_new_session=True,
        env=cli_env({"HPO_TEST_MISBEHAVE": "signals_its_group,ok"}))
    assert run.returncode == 0, run.stdout + run.stderr
    assert [r["state"] for r in sorted(trial_rows(tmp_path / "hpo.db"),
                                       key=lambda r: r["number"])] == ["COMPLETE", "COMPLETE"]
