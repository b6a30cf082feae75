"""What a trial's process can do to the orchestrator (issue 15): bad frames, threads, a
partner that reaps while we are stopped, ``hpo.*`` writes, grandchildren. Whatever a trial
does fails that trial alone, with the right reason; the orchestrator carries on.

The unit tests drive the pipe's two ends in this process; the slow ones run whole studies
with the misbehaving objectives of hpo_orchestrator.testing.objectives (``misbehave``).
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from hpo_orchestrator.scheduler import _channel
from hpo_orchestrator.scheduler._channel import Channel, ProtocolError
from hpo_orchestrator.worker import TrialOutcome, TrialProxy
from hpo_orchestrator.worker._link import Link, TrialEnded
from tests.conftest import run_cli, start_cli, trial_rows

TARGET = "objective.target=hpo_orchestrator.testing.misbehaving:"


@pytest.fixture
def pipe() -> Any:
    """(the orchestrator's Channel, the child's Connection) over a real socketpair."""
    ours, theirs = socket.socketpair()
    channel, child = Channel(ours), Connection(theirs.detach())
    yield channel, child
    channel.close()
    child.close()


def _frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


class _RunsCode:
    def __reduce__(self) -> tuple[Any, ...]:
        return (pytest.exit, ("a child's frame ran code in the orchestrator",))


# --- the pipe: complete frames only, never a block, every fault a ProtocolError ----------

def test_a_partial_frame_never_blocks_and_stalls_into_a_protocol_error(
        pipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    channel, child = pipe
    raw = socket.socket(fileno=child.fileno())  # write a raw partial frame, as a careless child
    try:
        raw.sendall(b"\x00\x01\x00\x00" + b"0123456789")
    finally:
        raw.detach()
    assert channel.receive() == []  # returns at once: nothing complete yet
    channel.check_stall()  # not stalled yet
    monkeypatch.setattr(_channel, "STALL_S", 0.0)
    time.sleep(0.01)
    with pytest.raises(ProtocolError, match=r"^protocol: .*middle of a message"):
        channel.check_stall()


@pytest.mark.parametrize("data, match", [
    (_frame(b"\xde\xad\xbe\xef" * 4), "unreadable message"),
    (struct.pack("!i", 0x7FFFFFF0) + b"x" * 100, "message of 2147483632 bytes"),
    (struct.pack("!i", -1) + struct.pack("!Q", 1 << 40), "message of"),
    (struct.pack("!i", -7), "message of -7 bytes"),
    (_frame(b"cnonexistent_module_of_hpo_tests\nThing\n)R."), "not part of a message"),
    (_frame(pickle.dumps(("phase", _RunsCode()))), "not part of a message"),
    (_frame(pickle.dumps(("result", "not an outcome"))), "not a message"),
    (_frame(pickle.dumps(["call", "suggest_float"])), "not a message"),
    (_frame(pickle.dumps(("exit",))), "not a message"),
], ids=["junk", "oversized", "oversized-long-header", "negative", "unpicklable", "runs-code",
        "bad-result", "not-a-tuple", "unknown-kind"])
def test_bad_bytes_are_a_protocol_error(pipe: Any, data: bytes, match: str) -> None:
    channel, child = pipe
    raw = socket.socket(fileno=child.fileno())
    try:
        raw.sendall(data)
    finally:
        raw.detach()
    with pytest.raises(ProtocolError, match=f"^protocol: .*{match}"):
        channel.receive()


def test_whole_messages_arrive_in_order_however_they_are_split(pipe: Any) -> None:
    channel, child = pipe
    big = "y" * 3_000_000  # several socket buffers: read over many calls
    sent = [("started",), ("phase", "train"), ("call", "set_user_attr", ("my.big", big), {}),
            ("result", TrialOutcome(kind="value", value=1.5))]
    writer = threading.Thread(target=lambda: [child.send(m) for m in sent])
    writer.start()
    got: list[tuple[Any, ...]] = []
    while len(got) < len(sent):
        got += channel.receive()
        time.sleep(0.001)
    writer.join()
    assert got == sent


def test_replies_a_child_never_reads_are_a_protocol_error(pipe: Any) -> None:
    channel, _child = pipe
    with pytest.raises(ProtocolError, match=r"^protocol: .*unread"):
        for _ in range(1000):
            channel.send(("ok", "z" * 100_000))  # never blocks, however full the socket


# --- the proxy: safe under threads -------------------------------------------------------

def _serve_in_thread(channel: Channel, stop: threading.Event, seen: list[Any]) -> threading.Thread:
    """A stand-in orchestrator: suggest_float answers its ``low``; set_user_attr ok."""
    def loop() -> None:
        while not stop.is_set():
            for message in channel.receive():
                seen.append(message)
                if message[0] == "call":
                    _, method, args, _kwargs = message
                    channel.send(("ok", args[1] if method == "suggest_float" else None))
            channel.flush()
            time.sleep(0.0005)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_the_proxy_answers_each_thread_its_own_reply(pipe: Any) -> None:
    channel, child = pipe
    link = Link(child)
    link.open_trial(0)
    proxy = TrialProxy(link, 0)
    stop, seen = threading.Event(), []  # type: ignore[var-annotated]
    server = _serve_in_thread(channel, stop, seen)
    wrong: list[tuple[int, float]] = []

    def suggest(k: int) -> None:
        for i in range(20):
            value = proxy.suggest_float(f"t{k}_{i}", 10.0 * k, 10.0 * k + 1)
            if value != 10.0 * k:
                wrong.append((k, value))

    def attrs(k: int) -> None:
        for i in range(3):
            proxy.set_user_attr(f"test.blob{k}_{i}", str(k) * 40_000)

    threads = [threading.Thread(target=suggest, args=(k,)) for k in range(3)]
    threads += [threading.Thread(target=attrs, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    stop.set()
    server.join()
    assert not wrong
    blobs = [m for m in seen if m[0] == "call" and m[1] == "set_user_attr"]
    assert len(blobs) == 12 and all(set(m[2][1]) == {m[2][0][9]} for m in blobs)


def test_a_thread_that_outlives_its_trial_is_refused(pipe: Any) -> None:
    _channel_end, child = pipe
    link = Link(child)
    link.open_trial(3)
    proxy = TrialProxy(link, 3)
    link.close_trial()
    with pytest.raises(TrialEnded, match="trial 3 has ended"):
        proxy.suggest_float("late", 0.0, 1.0)
    link.open_trial(4)  # reuse mode: the next trial; the old object stays refused
    with pytest.raises(TrialEnded):
        proxy.report(1.0, 1)


# --- the hpo.* namespace is the orchestrator's -------------------------------------------

def test_the_proxy_refuses_hpo_attrs_except_the_objective_ones(pipe: Any) -> None:
    channel, child = pipe
    link = Link(child)
    link.open_trial(0)
    proxy = TrialProxy(link, 0)
    with pytest.raises(ValueError, match=r"'hpo\.retried'.*orchestrator's"):
        proxy.set_user_attr("hpo.retried", True)
    assert channel.receive() == []  # nothing was sent
    stop, seen = threading.Event(), []  # type: ignore[var-annotated]
    server = _serve_in_thread(channel, stop, seen)
    proxy.set_user_attr("hpo.params_effective", {"num_threads": 2})  # the built-ins' own
    proxy.set_user_attr("my.note", "fine")
    stop.set()
    server.join()
    assert [m[2][0] for m in seen] == ["hpo.params_effective", "my.note"]


def test_the_orchestrator_refuses_hpo_attrs_sent_past_the_proxy(pipe: Any) -> None:
    channel, child = pipe
    writes: list[Any] = []
    trial = SimpleNamespace(set_user_attr=lambda *a: writes.append(a), number=0)
    rt = SimpleNamespace(trial=trial, connection=channel, number=0)
    _channel._answer(rt, "set_user_attr", ("hpo.retried", True), {})  # type: ignore[arg-type]
    _channel._answer(rt, "set_user_attr", ("hpo.warning", "cpu only"), {})  # type: ignore[arg-type]
    first, second = child.recv(), child.recv()
    assert first[0] == "err" and "orchestrator's" in str(first[1])
    assert second == ("ok", None)
    assert writes == [("hpo.warning", "cpu only")]


# --- whole studies -----------------------------------------------------------------------

def _misbehave(tmp_path: Path, modes: str, *args: str, timeout: float = 240) -> Any:
    return run_cli(tmp_path, "run", "objective=custom", TARGET + "misbehave", "pruner=none",
                   "sampler=random", *args, env={"HPO_TEST_MISBEHAVE": modes}, timeout=timeout)


def _by_number(db: Path) -> dict[int, dict[str, Any]]:
    return {r["number"]: r for r in trial_rows(db)}


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
def test_a_half_written_frame_still_times_out(tmp_path: Path) -> None:
    """The trial writes half a frame, ignores SIGTERM and sleeps: the timeout still fires."""
    result = _misbehave(tmp_path, "partial", "study.n_trials=1", "scheduler.trial_timeout_s=3",
                        "scheduler.kill_grace_s=1", timeout=90)
    assert result.code == 0, result.stderr
    (row,) = trial_rows(result.db)
    assert row["state"] == "FAIL" and row["attrs"]["hpo.fail_reason"] == "timeout"


@pytest.mark.slow
def test_sigterm_stops_a_run_whose_child_wrote_half_a_frame(tmp_path: Path) -> None:
    proc = start_cli(tmp_path, "run", "objective=custom", TARGET + "misbehave", "pruner=none",
                     "study.n_trials=2", "scheduler.kill_grace_s=1",
                     env={"HPO_TEST_MISBEHAVE": "partial"})
    try:
        _wait_for(lambda: any("x" in _params(tmp_path / "hpo.db", r) for r in _rows(tmp_path)))
        time.sleep(1.0)  # the frame is written right after the suggest
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert {r["attrs"].get("hpo.fail_reason") for r in _rows(tmp_path)} <= {"interrupted"}


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

def _rows(tmp_path: Path) -> list[dict[str, Any]]:
    db = tmp_path / "hpo.db"
    try:
        return trial_rows(db) if db.exists() else []
    except Exception:  # the database is being created
        return []


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
        for pid in grandchildren:  # its own child is beyond reach (README: not contained)
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
