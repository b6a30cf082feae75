"""The pipe between the orchestrator and a trial's child, both ends in this process: the
orchestrator's Channel reads complete frames only, never blocks, and turns every fault into
a ProtocolError; the child's proxy is safe under threads and keeps out of ``hpo.*``.
(Whole studies with misbehaving trials: tests/scheduler/test_reliability_children.py.)"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

import pytest

from hpo_orchestrator.scheduler import _calls, _channel
from hpo_orchestrator.scheduler._channel import Channel, ProtocolError
from hpo_orchestrator.worker import TrialOutcome, TrialProxy
from hpo_orchestrator.worker._link import Link, TrialEnded


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
    (_frame(pickle.dumps(("result", TrialOutcome(kind="value", value="1.5")))), "not a message"),
    (_frame(pickle.dumps(("result", TrialOutcome(kind="error", fail_reason="lost")))),
     "not a message"),
    (_frame(pickle.dumps(["call", "suggest_float"])), "not a message"),
    (_frame(pickle.dumps(("exit",))), "not a message"),
    (_frame(pickle.dumps(("result", TrialOutcome(kind="value", value=float("nan"))))), "not a message"),
    (_frame(pickle.dumps(("result", TrialOutcome(kind="value", value=(1.0, float("inf")))))),
     "not a message"),
    (_frame(pickle.dumps(("result", TrialOutcome(kind="value", value=True)))), "not a message"),
    (_frame(pickle.dumps(("result", TrialOutcome(kind="value", value=())))), "not a message"),
    (_frame(pickle.dumps(("ready", "early"))), "not a message"),
    (_frame(pickle.dumps(("phase", 3))), "not a message"),
    (_frame(pickle.dumps(("call", "suggest_float", ("x", 0, 1), {1: 2}))), "not a message"),
    (_frame(pickle.dumps(("call", "suggest_float", ("x", 0, 1), {}, "tag"))), "not a message"),
], ids=["junk", "oversized", "oversized-long-header", "negative", "unpicklable", "runs-code",
        "bad-result", "text-value", "foreign-reason", "not-a-tuple", "unknown-kind", "nan-value",
        "infinite-objective", "bool-value", "no-values", "ready-with-args", "phase-not-text",
        "call-kwargs-not-text", "call-tag-not-a-number"])
def test_bad_bytes_are_a_protocol_error(pipe: Any, data: bytes, match: str) -> None:
    channel, child = pipe
    raw = socket.socket(fileno=child.fileno())
    try:
        raw.sendall(data)
    finally:
        raw.detach()
    with pytest.raises(ProtocolError, match=f"^protocol: .*{match}"):
        channel.receive()


@pytest.mark.parametrize("message", [
    ("started",), ("ready",), ("phase", None), ("phase", "train"),
    ("call", "suggest_float", ("x", 0.0, 1.0), {"log": False}),
    ("call", "suggest_float", ("x", 0.0, 1.0), {"log": False}, 7),
    ("result", TrialOutcome(kind="value", value=1)),
    ("result", TrialOutcome(kind="value", value=(0.5, -2.0, 3))),
    ("result", TrialOutcome(kind="pruned")),
    ("result", TrialOutcome(kind="error", fail_reason="oom", error="CUDA out of memory")),
    ("result", TrialOutcome(kind="error", fail_reason="exception", traceback="Traceback ...")),
], ids=lambda m: "-".join(str(getattr(p, "kind", p)) for p in m[:2]))
def test_every_well_formed_message_is_accepted(pipe: Any, message: tuple[Any, ...]) -> None:
    """The other direction of the checks above: what the child's proxy sends gets through."""
    channel, child = pipe
    child.send(message)
    assert channel.receive() == [message]


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
                    _, method, args, _kwargs, tag = message
                    channel.send(("ok", args[1] if method == "suggest_float" else None, tag))
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
    rt = SimpleNamespace(trial=trial, connection=channel, number=0, space=None)
    _calls._answer(rt, "set_user_attr", ("hpo.retried", True), {}, 1)  # type: ignore[arg-type]
    _calls._answer(rt, "set_user_attr", ("hpo.warning", "cpu only"), {}, 2)  # type: ignore[arg-type]
    first, second = child.recv(), child.recv()
    assert first[0] == "err" and "orchestrator's" in str(first[1]) and first[2] == 1
    assert second == ("ok", None, 2)
    assert writes == [("hpo.warning", "cpu only")]


@pytest.mark.parametrize(("dialect", "step", "refused"), [
    (None, 2**63, True), ("sqlite", 2**63 - 1, False), ("postgresql", 2**31, True),
    ("postgresql", 2**31 - 1, False), ("sqlite", 1e30, True)])
def test_a_step_the_storage_cannot_keep_fails_its_trial_not_the_run(
        pipe: Any, dialect: str | None, step: float, refused: bool) -> None:
    """trial.report(x, 2**63) on sqlite (2**31 on PostgreSQL: Optuna's step is an INTEGER)
    failed the write of the trial's end: the run stopped with an OverflowError and its trials
    stayed RUNNING. Refused at the call, it is the objective's error."""
    channel, child = pipe
    reports: list[Any] = []
    engine = None if dialect is None else SimpleNamespace(dialect=SimpleNamespace(name=dialect))
    trial = SimpleNamespace(report=lambda *a: reports.append(a), number=0,
                            study=SimpleNamespace(directions=["minimize"]),
                            storage=SimpleNamespace(engine=engine) if engine else SimpleNamespace())
    rt = SimpleNamespace(trial=trial, connection=channel, number=0, reports=[], spawned_at=0.0,
                         space=None)
    _calls._answer(rt, "report", (0.5, step), {}, 1)  # type: ignore[arg-type]
    reply = child.recv()
    assert (reply[0] == "err") is refused and (len(reports) == 0) is refused, reply
    if refused:
        assert "too large" in str(reply[1]) and "bit integer" in str(reply[1])


# --- replies a trial never read (issue 28, item 7) -----------------------------------------

def test_a_reply_nobody_waits_for_is_dropped_by_the_next_call_and_by_the_wait_for_a_job(
        pipe: Any) -> None:
    """Replies to untagged requests (a call frame the objective wrote itself) sit before the
    next reply and before the next Job: the Link skips them, so a call gets its own answer
    and a reuse worker its job, not a stale ``("ok", ...)`` tuple."""
    from hpo_orchestrator.worker import Job

    channel, child = pipe
    link = Link(child)
    link.open_trial(3)
    channel.send(("ok", "stale", None))  # the answer to the objective's own frame
    channel.send(("ok", "stale", 99))  # another request's (a forged tag)

    def serve() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for message in channel.receive():
                channel.send(("ok", "mine", message[4]))
                return
            time.sleep(0.001)
    server = threading.Thread(target=serve)
    server.start()
    assert link.call(3, ("call", "suggest_float", ("x", 0.0, 1.0), {})) == ("ok", "mine")
    server.join()
    link.close_trial()
    channel.send(("ok", "stale", None))  # left unread when the trial ended
    job = Job(trial_number=4, objective=None)  # type: ignore[arg-type]
    channel.send(job)
    assert link.recv_job() == job
