"""Unit tests of the stop signals (hpo_orchestrator/_signals.py) and of the sweep of a killed
run's leftovers (scheduler/_tree.sweep_left_behind); the whole-study tests are in
tests/scheduler/test_signals.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpo_orchestrator._signals import handling_stop_signals
from hpo_orchestrator.scheduler._tree import ProcessTrees, sweep_left_behind


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_each_stop_signal_interrupts_start_up_and_the_old_handler_comes_back(sig: int) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt), handling_stop_signals():
        os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) is before


def test_a_handler_given_is_called_instead() -> None:
    seen: list[int] = []
    with handling_stop_signals(lambda signum, _frame: seen.append(signum)):
        os.kill(os.getpid(), signal.SIGHUP)
    assert seen == [signal.SIGHUP]


def _record(run_dir: Path, owner: psutil.Process, processes: list[psutil.Process],
            host: str | None = None) -> Path:
    path = run_dir / f"processes-{owner.pid}.json"
    path.write_text(json.dumps({"host": host or socket.gethostname(),
                                "orchestrator": [owner.pid, owner.create_time()],
                                "processes": [[p.pid, p.create_time()] for p in processes]}))
    return path


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def test_a_dead_orchestrators_leftovers_are_killed(tmp_path: Path, sleeper: psutil.Process) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = psutil.Process(dead.pid)
    record = _record(tmp_path, owner, [sleeper])
    dead.wait()
    assert sweep_left_behind(tmp_path) == 1
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not record.exists()


def test_a_live_orchestrators_or_another_hosts_records_are_left_alone(
        tmp_path: Path, sleeper: psutil.Process) -> None:
    _record(tmp_path, psutil.Process(), [sleeper])  # this process: alive
    assert sweep_left_behind(tmp_path) == 0 and sleeper.is_running()
    (tmp_path / f"processes-{os.getpid()}.json").unlink()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    record = _record(tmp_path, psutil.Process(dead.pid), [sleeper], host="another-host")
    dead.wait()  # its pids name processes of that host, not of this one
    assert sweep_left_behind(tmp_path) == 0 and sleeper.is_running() and record.exists()


def test_a_reused_pid_is_not_killed(tmp_path: Path, sleeper: psutil.Process) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = psutil.Process(dead.pid)
    path = _record(tmp_path, owner, [sleeper])
    dead.wait()
    record = json.loads(path.read_text())
    record["processes"][0][1] -= 100.0  # the pid named another process, created earlier
    path.write_text(json.dumps(record))
    assert sweep_left_behind(tmp_path) == 0 and sleeper.is_running()


def test_a_sweep_since_a_trials_start_kills_what_it_started_at_once() -> None:
    """psutil's create_time() on Linux counts from /proc/stat's boot time in whole seconds: a
    process started right after the trial's start read up to a second earlier, and the
    sweep at the end of a short trial spared it."""
    older = subprocess.Popen(["sleep", "600"])
    try:
        time.sleep(0.1)  # more than a clock tick before the trial's start
        started = time.time()
        newer = subprocess.Popen(["sleep", "600"])
        trees = ProcessTrees()
        trees.scan({0: os.getpid()}, force=True)  # this process stands for the trial's worker
        assert trees.sweep(0, since_epoch=started) == [newer.pid]
        newer.wait(timeout=10)  # (its status: the sweep's reaping of what came to it may take it)
        assert older.poll() is None
    finally:
        older.kill()
        older.wait()
