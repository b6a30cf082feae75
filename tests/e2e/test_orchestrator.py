"""Whole studies in real processes: pinning, placement, pruning, failures, Ctrl-C, status."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import threading
import time
from datetime import datetime
from pathlib import Path

import optuna
import psutil
import pytest

from hpo_orchestrator.testing.fake_gpu import fake_uuid
from tests.conftest import max_overlap, run_cli, start_cli, trial_rows

pytestmark = pytest.mark.slow

TARGET = "objective.target=tests.objectives:"

# Makes the sqlite database "full" once HPO_TEST_DB_FULL_AFTER_COMPLETE trials are COMPLETE
# (counted by events, not seconds: a loaded machine starts slower): every SQLAlchemy
# connection made after that gets max_page_count = its page count.
DB_FULL_SITECUSTOMIZE = """
import os
after = os.environ.get("HPO_TEST_DB_FULL_AFTER_COMPLETE")
if after and "HPO_TRIAL_NUMBER" not in os.environ:
    import sqlalchemy
    from sqlalchemy import event

    @event.listens_for(sqlalchemy.engine.Engine, "engine_connect")
    def _full(connection):
        raw = connection.connection.dbapi_connection
        try:
            done = raw.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
        except Exception:  # no schema yet
            return
        if done >= int(after):
            pages = raw.execute("PRAGMA page_count").fetchone()[0]
            raw.execute(f"PRAGMA max_page_count = {pages}")
"""

SITECUSTOMIZE = """
import os, time
after = os.environ.get("HPO_TEST_DB_FULL_AFTER_S")
if after and "HPO_TRIAL_NUMBER" not in os.environ:
    import sqlalchemy
    from sqlalchemy import event
    deadline = time.monotonic() + float(after)

    @event.listens_for(sqlalchemy.engine.Engine, "engine_connect")
    def _full(connection):
        if time.monotonic() > deadline:
            raw = connection.connection.dbapi_connection
            pages = raw.execute("PRAGMA page_count").fetchone()[0]
            raw.execute(f"PRAGMA max_page_count = {pages}")
"""

SITECUSTOMIZE = """
import os
log = os.environ.get("HPO_TEST_ENV_LOG")
if log and "HPO_TRIAL_NUMBER" in os.environ:
    with open(os.path.join(log, str(os.getpid())), "w") as handle:
        handle.write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
"""


def _rows_so_far(db: Path) -> list[dict]:  # type: ignore[type-arg]
    """Trials written so far; none while the orchestrator is still creating the database."""
    try:
        return trial_rows(db) if db.exists() else []
    except sqlite3.OperationalError:
        return []


def _wait_for_running(db: Path, count: int, timeout: float = 60) -> None:
    """Wait until at least ``count`` trials are RUNNING (or, with count 0, any trial exists)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _rows_so_far(db)
        if (len([r for r in rows if r["state"] == "RUNNING"]) >= count) if count else rows:
            return
        time.sleep(0.2)


@pytest.mark.long
def test_pinning_and_placement_on_two_fake_gpus(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    envlog = tmp_path / "envlog"
    envlog.mkdir()
    # CUDA's own default order (fastest first) in the user's shell: the children must still
    # number GPUs as NVML does, or CUDA_VISIBLE_DEVICES=1 can name another card than gpu1.
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": "2", "HPO_TEST_ENV_LOG": str(envlog),
           "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    result = cli("run", "objective=custom", TARGET + "pinned", "scheduler.parallel=4",
                 "scheduler.trials_per_gpu=2", "study.n_trials=12", "pruner=none", env=env)
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert len(rows) == 12 and all(r["state"] == "COMPLETE" for r in rows)

    first_line = {int(p.name): p.read_text() for p in envlog.iterdir()}
    per_gpu: dict[int, list[tuple[datetime, datetime]]] = {0: [], 1: []}
    for row in rows:
        attrs = row["attrs"]
        gpu = attrs["hpo.gpu_index"]
        # pinned by UUID (an index would depend on CUDA's device order)
        assert attrs["hpo.gpu_uuid"] == fake_uuid(gpu)
        assert attrs["hpo.cuda_visible_devices"] == fake_uuid(gpu)
        # what the interpreter saw before any of our code ran, and what the objective saw
        assert first_line[attrs["hpo.pid"]] == fake_uuid(gpu)
        assert attrs["test.cuda_visible_devices"] == fake_uuid(gpu)
        assert attrs["test.cuda_device_order"] == "PCI_BUS_ID"
        for key in ("hpo.host", "hpo.slot", "hpo.startup_s", "hpo.exit_code", "hpo.num_threads"):
            assert key in attrs
        # a reused process lives on after its trial: no exit code to record
        assert attrs["hpo.exit_code"] == (0 if attrs["hpo.worker_mode"] == "fresh" else None)
        assert attrs["hpo.startup_s"] > 0
        per_gpu[gpu].append((datetime.fromisoformat(row["start"]),
                             datetime.fromisoformat(row["end"])))
    assert per_gpu[0] and per_gpu[1], "both fake GPUs must be used"
    assert max(max_overlap(v) for v in per_gpu.values()) <= 2
    assert max_overlap(per_gpu[0] + per_gpu[1]) >= 3  # really in parallel


@pytest.mark.long
def test_lightgbm_study_prunes_and_logs_effective_params(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "scheduler.parallel=2", "study.n_trials=8", "objective.n_rows=4000",
                 "objective.num_boost_round=100", "pruner=median", "pruner.n_startup_trials=2",
                 "pruner.n_warmup_steps=1", "sampler=random", "sampler.seed=1")
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}
    assert any(r["state"] == "PRUNED" for r in rows), "expected some pruning"
    for row in rows:
        effective = row["attrs"]["hpo.params_effective"]
        assert effective["device_type"] == "cpu"  # CPU slots
        assert effective["num_threads"] == row["attrs"]["hpo.num_threads"]
        assert row["attrs"]["hpo.gpu_index"] is None
    assert "trials by state" in result.stdout  # ends with the status summary
    study = optuna.load_study(study_name="hpo", storage=f"sqlite:///{result.db}")
    assert len(study.trials) == 8


@pytest.mark.long
def test_torch_study_logs_what_ran(cli) -> None:  # type: ignore[no-untyped-def]
    """hpo.params_effective is read from torch and the DataLoader during the first step: on a
    CPU slot no autocast ran (the config's bf16 applies on GPUs only), float32 came out."""
    result = cli("run", "objective=torch_mlp", "study.n_trials=2", "objective.n_samples=2000",
                 "objective.epochs=1", "objective.batch_size=[64,128]", "objective.bf16=true")
    assert result.code == 0, result.stderr
    for row in trial_rows(result.db):
        effective = row["attrs"]["hpo.params_effective"]
        assert effective["device"] == "cpu" and effective["autocast_dtype"] is None
        assert effective["output_dtype"] == "float32" and effective["pin_memory"] is False
        assert effective["num_workers"] == 0 and effective["prefetch_factor"] is None
        assert "hpo.params_mismatch" not in row["attrs"]  # batch_size ran as suggested


def test_pruning_with_median(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "objective=custom", TARGET + "curves", "pruner=median",
                 "pruner.n_startup_trials=3", "pruner.n_warmup_steps=1", "scheduler.parallel=2",
                 "study.n_trials=14", "sampler=random", "sampler.seed=3")
    assert result.code == 0, result.stderr
    states = [r["state"] for r in trial_rows(result.db)]
    assert states.count("PRUNED") >= 2 and states.count("COMPLETE") >= 3


CHAOS_REASON = {"ok": None, "raise": "exception", "abort": "killed", "hang": "timeout",
                "nan": "exception", "none": "exception", "memory": "oom", "sigkill": "killed"}
CHAOS_MODES = list(CHAOS_REASON)  # tests.objectives.chaos: mode = number % 8


def _kill_random_children(cli_pid: int, stop: threading.Event, killed: set[int]) -> None:
    """From outside, SIGKILL a random running trial process now and then (at most 3)."""
    rng = random.Random(0)
    while not stop.wait(1.5) and len(killed) < 3:
        try:
            children = psutil.Process(cli_pid).children()
        except psutil.Error:
            return
        if children:
            victim = rng.choice(children)
            try:
                victim.kill()
                killed.add(victim.pid)
            except psutil.Error:
                pass


@pytest.mark.long
def test_chaos_failures_are_contained_classified_and_retried(tmp_path: Path) -> None:
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "chaos", "scheduler.parallel=4",
                     "study.n_trials=8", "scheduler.trial_timeout_s=4", "scheduler.kill_grace_s=1",
                     "scheduler.max_retries=1", "sampler=random")
    stop, killed = threading.Event(), set()
    killer = threading.Thread(target=_kill_random_children, args=(proc.pid, stop, killed))
    killer.start()
    try:
        _out, err = proc.communicate(timeout=240)
    finally:
        stop.set()
        killer.join()
    assert proc.returncode == 0, err
    rows = {r["number"]: r for r in trial_rows(tmp_path / "hpo.db")}
    assert not [r for r in rows.values() if r["state"] == "RUNNING"]
    retried_of = {r["attrs"]["hpo.retry_of"]: r for r in rows.values()
                  if "hpo.retry_of" in r["attrs"]}
    for number, row in rows.items():
        attrs = row["attrs"]
        natural = CHAOS_REASON[CHAOS_MODES[number % 8]]
        allowed = {natural, "killed"} if attrs["hpo.pid"] in killed else {natural}
        assert attrs.get("hpo.fail_reason") in allowed, (number, attrs, killed)
        assert row["state"] == ("COMPLETE" if attrs.get("hpo.fail_reason") is None else "FAIL")
        should_retry = attrs.get("hpo.fail_reason") in ("oom", "killed") \
            and attrs.get("hpo.attempt", 1) == 1
        assert bool(attrs.get("hpo.retried")) == should_retry, (number, attrs)
        if should_retry:
            retry = retried_of[number]  # same params, one attempt later
            assert retry["attrs"]["hpo.attempt"] == 2
            assert retry["attrs"]["hpo.retry_reason"] == attrs["hpo.fail_reason"]
            with sqlite3.connect(tmp_path / "hpo.db") as con:
                params = dict(con.execute("SELECT param_name, param_value FROM trial_params "
                                          "WHERE trial_id = ?", (row["trial_id"],)).fetchall())
                fixed = con.execute("SELECT value_json FROM trial_system_attributes WHERE "
                                    "trial_id = ? AND key = 'fixed_params'",
                                    (retry["trial_id"],)).fetchone()
            assert json.loads(fixed[0]) == params  # enqueued with the same params
    assert set(retried_of) <= set(rows)
    # n_trials counts every trial except the attempts that were retried
    assert len([r for r in rows.values() if not r["attrs"].get("hpo.retried")]) == 8
    messages = {CHAOS_MODES[n % 8]: r["attrs"].get("hpo.error", "") for n, r in rows.items()
                if r["attrs"]["hpo.pid"] not in killed}
    assert "boom from the objective" in messages.get("raise", "boom from the objective")
    assert "nan" in messages.get("nan", "nan")
    assert "None" in messages.get("none", "None")
    for n, row in rows.items():
        if CHAOS_MODES[n % 8] == "abort" and row["attrs"]["hpo.pid"] not in killed:
            assert "SIGABRT" in row["attrs"]["hpo.error"]
            assert row["attrs"]["hpo.exit_code"] == -signal.SIGABRT


def test_full_database_stops_cleanly_with_exit_1(tmp_path: Path) -> None:
    """The storage stops accepting writes mid-run: children stopped, one error line, exit 1,
    trials finished before it kept."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DB_FULL_SITECUSTOMIZE)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "HPO_TEST_DB_FULL_AFTER_COMPLETE": "3", "HPO_TEST_STEP_S": "0.5"}
    result = run_cli(tmp_path, "run", "objective=custom", TARGET + "pinned", "scheduler.parallel=2",
                     "study.n_trials=40", "pruner=none", env=env, timeout=120)
    assert result.code == 1, result.stdout + result.stderr
    assert "error: the storage stopped accepting writes" in result.stderr
    assert "Traceback" not in result.stderr and "hint:" in result.stderr
    rows = trial_rows(result.db)
    assert [r for r in rows if r["state"] == "COMPLETE"], "trials finished before stay finished"
    for row in rows:
        pid = row["attrs"].get("hpo.pid")
        assert pid is None or not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


@pytest.mark.long
def test_resume_finishes_exactly_n_trials_and_sql_contract(cli) -> None:  # type: ignore[no-untyped-def]
    args = ("run", "objective=custom", TARGET + "quadratic", "scheduler.parallel=2")
    first = cli(*args, "study.n_trials=3")
    assert first.code == 0, first.stderr
    assert sorted(r["number"] for r in trial_rows(first.db)) == [0, 1, 2]
    result = cli(*args, "study.n_trials=5")
    assert result.code == 0, result.stderr
    # the resume ran only the 2 missing trials, and the first run's trials are untouched
    assert sorted(r["number"] for r in trial_rows(result.db)) == [0, 1, 2, 3, 4]
    with sqlite3.connect(result.db) as con:
        counts = dict(con.execute(
            "SELECT state, COUNT(*) FROM trials WHERE study_id = (SELECT study_id FROM studies "
            "WHERE study_name = 'hpo') GROUP BY state").fetchall())
        durations = con.execute(
            "SELECT state, AVG((julianday(datetime_complete) - julianday(datetime_start)) * 86400)"
            " AS avg_s, COUNT(*) FROM trials WHERE study_id = (SELECT study_id FROM studies "
            "WHERE study_name = 'hpo') AND datetime_complete IS NOT NULL GROUP BY state").fetchall()
        config = json.loads(con.execute(
            "SELECT value_json FROM study_user_attributes WHERE key = 'hpo.config'").fetchone()[0])
    assert counts == {"COMPLETE": 5}
    assert durations[0][0] == "COMPLETE" and durations[0][1] > 0
    assert config["study"]["n_trials"] == 5

    status = cli("status", "--json")
    assert status.code == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["states"]["COMPLETE"]["count"] == 5
    # the best is the trial with the lowest value, and its params gave that value (5 random
    # x in [-2, 2]: "x near 0.5" failed 3 % of runs, when none of the five landed near it)
    with sqlite3.connect(result.db) as con:
        lowest = con.execute("SELECT MIN(value) FROM trial_values").fetchone()[0]
    best = report["best"]
    assert best["value"] == pytest.approx(lowest)
    assert (best["params"]["x"] - 0.5) ** 2 == pytest.approx(best["value"])
    text = cli("status")
    assert text.code == 0, text.stderr
    # the table says what the JSON says: 5 of 5 finished, all COMPLETE, the same best trial
    assert "finished 5 of 5" in text.stdout
    assert re.search(r"COMPLETE\W+5\W", text.stdout), text.stdout
    assert f"best trial {report['best']['number']}: " in text.stdout


def test_direction_conflict_is_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    args = ("run", "objective=custom", TARGET + "quadratic", "study.n_trials=1")
    assert cli(*args).code == 0
    result = cli(*args, "study.direction=maximize")
    assert result.code == 2 and "already exists with direction minimize" in result.stderr


@pytest.mark.long
def test_restart_after_kill_9_recovers_and_finishes_exactly_n(tmp_path: Path) -> None:
    """A restart on the same host fails the killed run's trials at once (their orchestrator's
    pid is gone), before it starts a trial of its own. The heartbeat grace is set far beyond
    the test, so only that check can recover them in time."""
    args = ("run", "objective=custom", TARGET + "pinned", "scheduler.parallel=2",
            "study.n_trials=6", "pruner=none", "scheduler.prefetch=1",
            "storage.heartbeat_interval_s=1", "storage.grace_period_s=3600")
    env = {"HPO_TEST_STEP_S": "1.0"}
    first = start_cli(tmp_path, *args, env=env)
    db = tmp_path / "hpo.db"
    # Two trials on slots and one asked ahead (scheduler.prefetch=1), each with its owner
    # recorded: nothing is asked while the slots stay busy, so the kill lands between asks
    # (a kill in the milliseconds between an ask and its first attrs is left to the heartbeat).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = [r for r in _rows_so_far(db) if r["state"] == "RUNNING"]
        if len(running) >= 3 and all("hpo.orchestrator_pid" in r["attrs"] for r in running):
            break
        time.sleep(0.1)
    first.kill()
    first.communicate()
    time.sleep(1.0)  # its children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
    orphans = {r["number"] for r in trial_rows(db)
               if r["state"] == "RUNNING" and "hpo.pid" in r["attrs"]}
    # asked ahead, no slot took it: it never ran, and goes back to the queue
    ahead = {r["number"] for r in trial_rows(db)
             if r["state"] == "RUNNING" and "hpo.pid" not in r["attrs"]}
    assert orphans
    known = {r["number"] for r in trial_rows(db)}
    second = start_cli(tmp_path, *args, env=env)
    # The first trial the restart starts is the event to check against (not a time bound).
    # (not a WAITING retry: the recovery enqueues those while it goes)
    while second.poll() is None and not {r["number"] for r in _rows_so_far(db)
                                         if r["state"] != "WAITING"} - known - ahead:
        time.sleep(0.1)
    rows = [r for r in _rows_so_far(db) if r["number"] in orphans]
    states = {r["number"]: r["state"] for r in rows}
    if set(states.values()) != {"FAIL"}:
        second.kill()
        second.communicate()
        raise AssertionError(f"the restart started a trial with the killed run's still {states}")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    # it says so, and counts them as this run's (it said "nothing to run" where the killed
    # run had claimed the whole budget, then ran them without progress)
    assert f"recovering {len(orphans)} trial(s) that a stopped run left running" in out, out
    assert f"{len(ahead)} trial(s) the stopped run had asked ahead" in out or not ahead, out
    assert f"({len(known) - len(orphans) - len(ahead)} done before)" in out, out
    rows = trial_rows(db)
    assert not [r for r in rows if r["state"] == "RUNNING"]
    lost = [r for r in rows if r["state"] == "FAIL"]
    assert lost and all(r["attrs"]["hpo.fail_reason"] == "lost" for r in lost)
    # each lost trial was retried with its params; the retries finished
    retries = {r["attrs"].get("hpo.retry_of"): r for r in rows if "hpo.retry_of" in r["attrs"]}
    assert sorted(retries) == sorted(r["number"] for r in lost)
    assert all(r["attrs"]["hpo.retried"] is True for r in lost)
    assert all(r["state"] == "COMPLETE" and r["attrs"]["hpo.retry_reason"] == "lost"
               for r in retries.values())
    # the kill was not the trials' failure: no attempt spent (hpo.attempt absent: 1)
    assert all("hpo.attempt" not in r["attrs"] for r in retries.values()), retries
    # n_trials counts every trial but the retried attempts: exactly 6
    assert len([r for r in rows if not r["attrs"].get("hpo.retried")]) == 6
