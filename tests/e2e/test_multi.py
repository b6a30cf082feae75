"""Several orchestrators: one study over several hosts, several studies on one host's GPUs,
GPUs busy with someone else's work, and CPU-only runs on one host's cores.

"Hosts" are simulated on this machine: each orchestrator gets its own scheduler.host and
its own lease folder (separate machines share neither), and its own fake GPUs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from hpo_orchestrator.scheduler._race_hooks import BUDGET_RACE_ENV
from tests.conftest import cli_env, max_overlap, run_cli, start_cli

pytestmark = pytest.mark.slow

TARGET = "objective.target=tests.objectives:"


def _trials(url: str, study: str) -> list[dict[str, Any]]:
    """(number, state, start, end, attrs) of every trial, with plain SQL (sqlite or PostgreSQL)."""
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as con:
        rows = con.execute(sqlalchemy.text(
            "SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete "
            "FROM trials t JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = :n"),
            {"n": study}).all()
        attrs: dict[int, dict[str, Any]] = {}
        for tid, key, value in con.execute(sqlalchemy.text(
                "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a JOIN trials t "
                "ON t.trial_id = a.trial_id JOIN studies s ON s.study_id = t.study_id "
                "WHERE s.study_name = :n"), {"n": study}):
            attrs.setdefault(tid, {})[key] = json.loads(value)
    engine.dispose()

    def ts(value: Any) -> datetime | None:
        return value if value is None or isinstance(value, datetime) else datetime.fromisoformat(value)

    return [{"number": n, "state": str(st).split(".")[-1], "start": ts(s), "end": ts(e),
             "attrs": attrs.get(tid, {})} for tid, n, st, s, e in rows]


def _host(tmp_path: Path, name: str, url: str, study: str, *extra: str,
          env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    leases = tmp_path / f"leases-{name}"
    return start_cli(tmp_path, "run", "objective=custom", TARGET + "pinned", "pruner=none",
                     f"storage.url={url}", f"study.name={study}", f"scheduler.host={name}",
                     f"scheduler.lease_dir={leases}", "scheduler.parallel=2",
                     "scheduler.avoid_busy_gpus=false", *extra,
                     env={"HPO_ORCHESTRATOR_FAKE_GPUS": "2", "HPO_TEST_STEP_S": "0.15", **(env or {})})


def _finish(proc: subprocess.Popen[str], timeout: float = 180) -> None:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # its children follow (PR_SET_PDEATHSIG): nothing left to disturb other tests
        out, err = proc.communicate()
        raise AssertionError(f"orchestrator still running after {timeout} s:\n{out[-2000:]}{err}") from None
    assert proc.returncode == 0, out[-2000:] + err


def _wait_running(url: str, study: str, hosts: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            running = {t["attrs"].get("hpo.host") for t in _trials(url, study) if t["state"] == "RUNNING"}
        except sqlalchemy.exc.SQLAlchemyError:
            running = set()
        if hosts <= running:
            return
        time.sleep(0.2)
    raise AssertionError(f"{hosts} never all had RUNNING trials")


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.long
def test_two_hosts_finish_exactly_n_trials(tmp_path: Path, shared_url: str) -> None:
    study = f"multi-{uuid.uuid4().hex[:8]}"
    a = _host(tmp_path, "host-a", shared_url, study, "study.n_trials=40")
    b = _host(tmp_path, "host-b", shared_url, study, "study.n_trials=40")
    _finish(a)
    _finish(b)
    trials = _trials(shared_url, study)
    assert len(trials) == 40 and all(t["state"] == "COMPLETE" for t in trials)
    assert sorted(t["number"] for t in trials) == list(range(40))
    hosts = [t["attrs"]["hpo.host"] for t in trials]
    assert hosts.count("host-a") > 0 and hosts.count("host-b") > 0


@pytest.mark.long
def test_a_forced_budget_race_still_starts_exactly_n_trials(tmp_path: Path, shared_url: str) -> None:
    """Three hosts count the budget at the same moment and hold their ask until all three
    have counted (scheduler/_race_hooks.py): only the study's lock keeps them to n_trials. Not left
    to luck: without the lock every host counts 0 and asks, 3 trials for 2."""
    study = f"race-{uuid.uuid4().hex[:8]}"
    race = tmp_path / "race"
    race.mkdir()
    env = {BUDGET_RACE_ENV: f"{race}:3:2"}
    hosts = [_host(tmp_path, f"host-{name}", shared_url, study, "study.n_trials=2",
                   "scheduler.parallel=1", env=env) for name in "abc"]
    for host in hosts:
        _finish(host)
    assert len(list(race.glob("started-*"))) == 3  # all three reached the race
    trials = _trials(shared_url, study)
    assert sorted(t["number"] for t in trials) == [0, 1]
    assert all(t["state"] == "COMPLETE" for t in trials)


def test_add_trials_on_two_hosts_started_together_adds_n_once(tmp_path: Path, shared_url: str) -> None:
    """The behaviour docs/CLUSTER.md states: each orchestrator turns study.add_trials=N into a
    total when it starts (the trials ended then + N). Two that start before either has claimed
    a trial reach the same total: N more in all, not 2N. The race hook holds both at their first
    claim until both have resolved, so this does not depend on timing."""
    study = f"add-{uuid.uuid4().hex[:8]}"
    _finish(_host(tmp_path, "host-a", shared_url, study, "study.n_trials=2"))
    race = tmp_path / "race"
    race.mkdir()
    env = {BUDGET_RACE_ENV: f"{race}:2:0.5"}
    hosts = [_host(tmp_path, f"host-{name}", shared_url, study, "study.add_trials=3",
                   "scheduler.parallel=1", env=env) for name in "ab"]
    for host in hosts:
        _finish(host)
    assert len(list(race.glob("started-*"))) == 2  # both reached their first claim
    trials = _trials(shared_url, study)
    assert sorted(t["number"] for t in trials) == list(range(5))
    assert all(t["state"] == "COMPLETE" for t in trials)


@pytest.mark.long
def test_a_surviving_host_recovers_a_killed_one(tmp_path: Path, shared_url: str) -> None:
    study = f"multi-{uuid.uuid4().hex[:8]}"
    args = ("study.n_trials=20", "storage.heartbeat_interval_s=1", "storage.grace_period_s=3")
    slow = {"HPO_TEST_STEP_S": "0.6"}
    a = _host(tmp_path, "host-a", shared_url, study, *args, env=slow)
    b = _host(tmp_path, "host-b", shared_url, study, *args, env=slow)
    _wait_running(shared_url, study, {"host-a", "host-b"})
    a.kill()  # no goodbye: its trials stay RUNNING until host-b's heartbeat check
    a.communicate()
    _finish(b)
    trials = _trials(shared_url, study)
    assert not [t for t in trials if t["state"] == "RUNNING"]
    lost = [t for t in trials if t["attrs"].get("hpo.fail_reason") == "lost"]
    # (one killed between its ask and its first attr write has no hpo.host: it was host-a's)
    assert lost and all(t["attrs"].get("hpo.host", "host-a") == "host-a" for t in lost)
    retries = {t["attrs"]["hpo.retry_of"] for t in trials if "hpo.retry_of" in t["attrs"]}
    assert retries == {t["number"] for t in lost}
    assert len([t for t in trials if not t["attrs"].get("hpo.retried")]) == 20


@pytest.mark.long
def test_two_studies_on_one_host_never_share_a_gpu_slot(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    leases = f"scheduler.lease_dir={tmp_path / 'leases'}"
    common = ("run", "objective=custom", TARGET + "pinned", "pruner=none", f"storage.url={url}",
              leases, "scheduler.parallel=2", "scheduler.trials_per_gpu=1", "study.n_trials=8")
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": "2", "HPO_TEST_STEP_S": "0.2"}
    one = start_cli(tmp_path, *common, "study.name=one", env=env)
    two = start_cli(tmp_path, *common, "study.name=two", env=env)
    _finish(one)
    _finish(two)
    trials = _trials(url, "one") + _trials(url, "two")
    assert len(trials) == 16 and all(t["state"] == "COMPLETE" for t in trials)
    for gpu in (0, 1):
        # ask() happens after the lease is taken and tell() before it is dropped
        intervals = [(t["start"], t["end"]) for t in trials if t["attrs"]["hpo.gpu_index"] == gpu]
        assert max_overlap(intervals) == 1, gpu


@pytest.mark.long
def test_a_second_study_takes_turns_on_a_gpu_that_reuse_workers_hold(tmp_path: Path) -> None:
    """One GPU, one slot, reuse workers (which keep their lease between trials): the second
    study's orchestrator does not wait for the first study to end. The first one's idle
    worker gives the lease up to it (issue 15), and never are two trials on the GPU."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    common = ("run", "objective=custom", TARGET + "pinned", "pruner=none", f"storage.url={url}",
              f"scheduler.lease_dir={tmp_path / 'leases'}", "scheduler.parallel=1",
              "scheduler.trials_per_gpu=1", "scheduler.worker_mode=reuse",
              "scheduler.avoid_busy_gpus=false")
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": "1", "HPO_TEST_STEP_S": "0.2"}
    # the first study long enough (20 x 0.6 s) to be still running when the second starts up
    one = start_cli(tmp_path, *common, "study.name=one", "study.n_trials=20", env=env)
    deadline = time.monotonic() + 120
    while not [t for t in _trials_so_far(url, "one") if "hpo.pid" in t["attrs"]]:
        assert time.monotonic() < deadline and one.poll() is None, "study one never started"
        time.sleep(0.1)
    two = start_cli(tmp_path, *common, "study.name=two", "study.n_trials=3", env=env)
    _finish(one)
    _finish(two)
    first, second = _trials(url, "one"), _trials(url, "two")
    assert len(first + second) == 23 and all(t["state"] == "COMPLETE" for t in first + second)
    assert max_overlap([(t["start"], t["end"]) for t in first + second]) == 1
    assert min(t["start"] for t in second) < max(t["end"] for t in first)


def _trials_so_far(url: str, study: str) -> list[dict[str, Any]]:
    try:
        return _trials(url, study)
    except sqlalchemy.exc.OperationalError:  # the database is being created
        return []


@pytest.mark.long
def test_killing_an_orchestrator_frees_its_slots(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    lease_dir = tmp_path / "leases"
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": "2", "HPO_TEST_SLEEP_S": "120"}
    common = (f"storage.url={url}", f"scheduler.lease_dir={lease_dir}", "scheduler.parallel=2",
              "scheduler.trials_per_gpu=1")
    hog = start_cli(tmp_path, "run", "objective=custom", TARGET + "sleepy", "study.name=hog",
                    "study.n_trials=2", *common, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(
            [t for t in _trials_or_empty(url, "hog") if t["state"] == "RUNNING"]) < 2:
        time.sleep(0.2)
    gpus = run_cli(tmp_path, "gpus", "--json", "--lease-dir", str(lease_dir), env=env)
    assert gpus.code == 0, gpus.stderr
    held = [slot for gpu in json.loads(gpus.stdout)["gpus"] for slot in gpu["slots"]]
    assert len(held) == 2 and {h["study"] for h in held} == {"hog"}
    assert {h["pid"] for h in held} == {hog.pid}

    other = start_cli(tmp_path, "run", "objective=custom", TARGET + "quadratic", "study.name=other",
                      "study.n_trials=2", *common, env=env)
    # It waits for a free GPU: it says so with a marker per GPU in the lease folder (so it
    # got past its start-up and found every slot leased), and has started no trial.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and other.poll() is None \
            and len(list(lease_dir.glob(f"*.waiting.{other.pid}-*"))) < 2 \
            and not _trials_or_empty(url, "other"):
        time.sleep(0.2)
    assert len(list(lease_dir.glob(f"*.waiting.{other.pid}-*"))) == 2
    assert other.poll() is None and not [
        t for t in _trials_or_empty(url, "other") if t["state"] != "WAITING"]
    hog.send_signal(signal.SIGKILL)
    hog.communicate()
    _finish(other, timeout=60)
    assert [t["state"] for t in _trials(url, "other")] == ["COMPLETE", "COMPLETE"]


def _trials_or_empty(url: str, study: str) -> list[dict[str, Any]]:
    try:
        return _trials(url, study)
    except sqlalchemy.exc.SQLAlchemyError:
        return []


FOREIGN_JOB = """
import datetime, sqlite3, sys, time
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    try:
        with sqlite3.connect(sys.argv[1], timeout=5) as con:
            if con.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0] >= 2:
                break
    except sqlite3.Error:
        pass
    time.sleep(0.1)
open(sys.argv[2], "w").write(datetime.datetime.now().isoformat())
"""


@pytest.mark.long
def test_a_gpu_busy_with_foreign_work_is_skipped_then_used(tmp_path: Path) -> None:
    ended = tmp_path / "foreign-ended"  # its last act: the local time it stops using gpu0
    # The foreign job ends once the study has 2 COMPLETE trials (not after a fixed time: on a
    # loaded machine the orchestrator may take longer than that to start its first trial).
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN_JOB, str(tmp_path / "hpo.db"), str(ended)],
                               env={**cli_env(), "HPO_FAKE_FOREIGN_GPU": "0"})
    try:
        result = run_cli(tmp_path, "run", "objective=custom", TARGET + "pinned", "pruner=none",
                         "scheduler.parallel=2", "scheduler.trials_per_gpu=1", "study.n_trials=12",
                         f"scheduler.lease_dir={tmp_path / 'leases'}",
                         env={"HPO_ORCHESTRATOR_FAKE_GPUS": "2", "HPO_TEST_STEP_S": "0.3"})
    finally:
        foreign.kill()
        foreign.wait()
    assert result.code == 0, result.stderr
    assert "note: gpu0 skipped: " in result.stdout and "MiB used by other processes" in result.stdout
    trials = sorted(_trials(f"sqlite:///{result.db}", "hpo"), key=lambda t: t["start"])
    first_on_0 = next(i for i, t in enumerate(trials) if t["attrs"]["hpo.gpu_index"] == 0)
    assert first_on_0 >= 2, [t["attrs"]["hpo.gpu_index"] for t in trials]  # skipped at first
    assert all(t["attrs"]["hpo.gpu_index"] == 1 for t in trials[:first_on_0])
    # used again only once the foreign process was gone (Optuna's start times are local time)
    assert trials[first_on_0]["start"] >= datetime.fromisoformat(ended.read_text())


class _Lines:
    """A running orchestrator's stdout, read as it comes (a thread), so that a test waits for
    a line instead of sleeping."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, []
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        """The first text matching ``pattern`` in the output, its lines joined and its spaces
        made one (the terminal's width wraps a long note); fails if the process ends or time
        runs out."""
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                found = re.search(pattern, re.sub(r"\s+", " ", "".join(self.lines)))
                if found is not None:
                    return found.group(0)
                left = deadline - time.monotonic()
                if left <= 0 or (not self._reader.is_alive() and self.proc.poll() is not None):
                    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.lines)}")
                self._new.wait(min(left, 1.0))

    def finish(self, timeout: float = 120) -> str:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=30)
        out = "".join(self.lines)
        assert self.proc.returncode == 0, out[-2000:] + (self.proc.stderr.read() if self.proc.stderr else "")
        return out


@pytest.mark.long
def test_two_cpu_runs_on_one_core_each_say_that_their_trials_share_it(tmp_path: Path) -> None:
    """Two CPU-only runs of one host each took one trial per core, so the host ran twice as
    many trials as cores without a word (issue 52). Each says so now: the second at its start,
    the first as soon as it sees the second; the run goes on, and status names the other run."""
    gate = tmp_path / "gate"  # the trials run until the test has seen both notes
    common = ("run", "objective=custom", TARGET + "gated", "pruner=none", "scheduler.gpus=none",
              "study.n_trials=1")
    env = {"HPO_TEST_GATE": str(gate)}
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})  # both runs on one core: inherited at their start
    try:
        first = _Lines(start_cli(tmp_path, *common, "study.name=first",
                                 "storage.url=sqlite:///first.db", env=env))
        first.wait_for(r"trial logs: ")  # its presence on the core is announced by now
        second = _Lines(start_cli(tmp_path, *common, "study.name=second",
                                  "storage.url=sqlite:///second.db", env=env))
    finally:
        os.sched_setaffinity(0, affinity)
    note = r"note: another hpo-orchestrator run .*?start it on other cores \(taskset -c\)"
    shared = "trials will share cores and run slower; wait for the other run to end"
    try:
        said = second.wait_for(note)
        assert f"(pid {first.proc.pid}, uid {os.getuid()} " in said and "study 'first')" in said
        assert re.search(r"is using 1 of (the|this host's) 1 core( this run may use)?, and this "
                         r"run's trials use 1:", said), said
        assert shared in said
        said = first.wait_for(note)
        assert f"(pid {second.proc.pid}, " in said and "study 'second')" in said and shared in said
    finally:
        gate.write_text("")
    assert "complete 1, pruned 0, failed 0" in first.finish()
    second.finish()
    status = run_cli(tmp_path, "status", "--storage", "sqlite:///first.db")
    assert status.code == 0, status.stderr
    assert "shared_cores: host " in status.stdout
    assert f"another hpo-orchestrator run (pid {second.proc.pid}, " in status.stdout
