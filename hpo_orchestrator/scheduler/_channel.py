"""The orchestrator's side of the pipe to each child (the protocol: worker/_protocol.py).

Every read of a child's bytes happens here, and none of them blocks: a :class:`Channel`
reads what its non-blocking socket holds, keeps a partial frame for later, and hands out
only complete frames. :func:`serve` waits on all open channels at once and handles what
arrived; :func:`drain` reads what a child sent before it exited. A child's
``suggest_*``/``report``/``should_prune``/``set_user_attr`` calls are answered by the real
``optuna.Trial`` held in its RunningTrial.

A child runs the user's code, so its bytes are not trusted to be well-formed: a frame that
is too large, stalls half-way, does not unpickle, names a class that is not a message, or is
not a message is a :class:`ProtocolError`. It fails that trial alone (``exception``, the
error starting with "protocol:") and the worker is replaced; the loop never waits for it.
"""

from __future__ import annotations

import inspect
import io
import math
import pickle
import selectors
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from hpo_orchestrator.db import StorageUnavailable
from hpo_orchestrator.scheduler._artifacts import record_artifact
from hpo_orchestrator.scheduler._reads import answer_read
from hpo_orchestrator.scheduler._trial import RunningTrial
from hpo_orchestrator.telemetry import TelemetrySampler
from hpo_orchestrator.worker import (
    ARTIFACT_CALL,
    OBJECTIVE_ATTRS,
    READ_CALLS,
    TRIAL_METHODS,
    TrialOutcome,
)

__all__ = ["MAX_FRAME_BYTES", "Channel", "ProtocolError", "drain", "ended", "serve"]

MAX_FRAME_BYTES = 16 << 20  # one message; a trial's attrs and traceback are far smaller
STALL_S = 15.0  # a frame's sender writes it in one go: a longer pause mid-frame is a fault
_MAX_OUTBOX_BYTES = 4 << 20  # replies a child leaves unread
_READ_BUDGET = 4 << 20  # bytes read from one child per serve(): no child starves the others
_HEADER = struct.Struct("!i")  # multiprocessing.connection's framing (the child's side)
_LONG_HEADER = struct.Struct("!Q")  # after a -1 header, for frames of 2 GiB and up

# The only classes a child's message may name: everything else in a message is a plain
# value (the proxy sends nothing else), so a frame can never run code in the orchestrator.
_ALLOWED_CLASSES = {
    ("hpo_orchestrator.worker._protocol", "TrialOutcome"),
    ("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset"),
    ("builtins", "bytearray"),
}


class ProtocolError(Exception):
    """A child's bytes broke the protocol: its trial fails, its worker is replaced."""


class _MessageUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_CLASSES:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a message")
        return super().find_class(module, name)


class Channel:
    """The orchestrator's end of one child's socket; never blocks.

    Owned by the loop (single-threaded). Sends are queued and written as the child reads
    them; reads return complete messages only. ``closed`` once the child's end is gone.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._inbox = bytearray()
        self._outbox = bytearray()
        self._partial_since: float | None = None  # when the unfinished frame last grew
        self.closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def wants_write(self) -> bool:
        return bool(self._outbox) and not self.closed

    def send(self, message: Any) -> None:
        """Queue a message for the child and write what its socket takes now."""
        if self.closed:
            return
        # Plain pickle: the child reads it with multiprocessing's Connection.recv (pickle.loads);
        # ForkingPickler's extra reducers are for handles, which no message holds (9x slower).
        payload = pickle.dumps(message)
        self._outbox += _HEADER.pack(len(payload)) + payload
        self.flush()

    def flush(self) -> None:
        """Write queued bytes; a child that leaves too many replies unread is at fault."""
        while self._outbox and not self.closed:
            try:
                sent = self._sock.send(self._outbox)
            except BlockingIOError:
                break
            except OSError:  # the child is gone; what it did not read does not matter
                self._outbox.clear()
                self.closed = True
                return
            del self._outbox[:sent]
        if len(self._outbox) > _MAX_OUTBOX_BYTES:
            raise ProtocolError(f"protocol: the child left {len(self._outbox)} bytes of replies "
                                "unread")

    def receive(self) -> list[tuple[Any, ...]]:
        """The complete messages that arrived; a partial frame stays for the next call."""
        budget = _READ_BUDGET
        while budget > 0 and not self.closed:
            try:
                chunk = self._sock.recv(min(budget, 1 << 16))
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True  # the child closed its end (or died)
                break
            self._inbox += chunk
            budget -= len(chunk)
            self._partial_since = time.monotonic()
            self._frame_size()  # refuse an oversized frame before buffering it
        messages = []
        while (size := self._frame_size()) is not None:
            header, total = size
            if len(self._inbox) < header + total:
                break
            payload = bytes(self._inbox[header:header + total])
            del self._inbox[:header + total]
            messages.append(_decode(payload))
        if not self._inbox:
            self._partial_since = None
        return messages

    def check_stall(self) -> None:
        """A frame's sender writes it in one go: one left unfinished for STALL_S is a fault
        (the child wrote a partial frame and went on with something else)."""
        if self._inbox and not self.closed and self._partial_since is not None \
                and time.monotonic() - self._partial_since > STALL_S:
            raise ProtocolError(f"protocol: the child stopped for over {STALL_S:.0f} s in the "
                                f"middle of a message ({len(self._inbox)} bytes sent)")

    def pending(self) -> bool:
        """Did the child send anything not yet read? (an idle reuse worker must not)"""
        if self._inbox:
            return True
        try:
            return bool(self._sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            return False
        except OSError:
            return False

    def close(self) -> None:
        self.closed = True
        self._sock.close()

    def _frame_size(self) -> tuple[int, int] | None:
        """(header bytes, payload bytes) of the frame at the head of the inbox, once known."""
        if len(self._inbox) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self._inbox)
        header = _HEADER.size
        if size == -1:
            if len(self._inbox) < header + _LONG_HEADER.size:
                return None
            (size,) = _LONG_HEADER.unpack_from(self._inbox, header)
            header += _LONG_HEADER.size
        if size < 0 or size > MAX_FRAME_BYTES:
            raise ProtocolError(f"protocol: a message of {size} bytes (the limit is "
                                f"{MAX_FRAME_BYTES})")
        return header, size


def _decode(payload: bytes) -> tuple[Any, ...]:
    try:
        message = _MessageUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:  # whatever the bytes make the unpickler raise
        raise ProtocolError(f"protocol: unreadable message ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None
    if not _well_formed(message):
        raise ProtocolError(f"protocol: not a message: {repr(message)[:200]}")
    return message  # type: ignore[no-any-return]


def _well_formed(message: Any) -> bool:
    if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
        return False
    kind, rest = message[0], message[1:]
    if kind in ("started", "ready"):
        return not rest
    if kind == "phase":
        return len(rest) == 1 and (rest[0] is None or isinstance(rest[0], str))
    if kind == "result":
        return len(rest) == 1 and _well_formed_outcome(rest[0])
    if kind == "call":
        return (len(rest) == 3 and isinstance(rest[0], str) and isinstance(rest[1], tuple)
                and isinstance(rest[2], dict) and all(isinstance(k, str) for k in rest[2]))
    return False


def _well_formed_outcome(outcome: Any) -> bool:
    """What the loop will tell Optuna and write: a number for a value, a known reason."""
    if not isinstance(outcome, TrialOutcome):
        return False
    plain = all(v is None or isinstance(v, str) for v in (outcome.error, outcome.traceback)) \
        and isinstance(outcome.children, bool)
    if outcome.kind == "value":
        values = outcome.value if isinstance(outcome.value, tuple) else (outcome.value,)
        return plain and bool(values) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in values)
    if outcome.kind == "error":
        return plain and outcome.fail_reason in ("exception", "oom")
    return plain and outcome.kind == "pruned"


def serve(running: Sequence[RunningTrial], timeout: float, sampler: TelemetrySampler | None) -> None:
    """Handle every message that arrives within ``timeout`` (sleep it when no pipe is open).

    A child that broke the protocol gets ``protocol_error`` set and its channel closed; the
    loop stops it and fails its trial.
    """
    open_trials = [rt for rt in running if rt.connection_open]
    if not open_trials:
        time.sleep(timeout)
        return
    with selectors.DefaultSelector() as selector:
        for rt in open_trials:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if rt.connection.wants_write else 0)
            selector.register(rt.connection, events, rt)
        ready = selector.select(timeout)
    for key, _ in ready:
        _guarded(key.data, _service, sampler)
    for rt in open_trials:
        if rt.connection_open:
            _guarded(rt, _check_stall, sampler)


def _service(rt: RunningTrial, sampler: TelemetrySampler | None) -> None:
    rt.connection.flush()
    for message in rt.connection.receive():
        _handle(rt, message, sampler)
    if rt.connection.closed:
        rt.connection_open = False


def _check_stall(rt: RunningTrial, _sampler: TelemetrySampler | None) -> None:
    rt.connection.check_stall()


def _guarded(rt: RunningTrial, step: Callable[[RunningTrial, TelemetrySampler | None], None],
             sampler: TelemetrySampler | None) -> None:
    try:
        step(rt, sampler)
    except ProtocolError as exc:
        rt.connection_open = False
        if rt.protocol_error is None:
            rt.protocol_error = str(exc)


def ended(running: Sequence[RunningTrial], reuse: bool,
          sampler: TelemetrySampler | None) -> list[RunningTrial]:
    """Trials whose process exited (their last messages read), and in reuse mode those
    whose result is in (the process lives on)."""
    done = []
    for rt in running:
        if rt.process.poll() is not None:
            drain(rt, sampler)
            done.append(rt)
        elif reuse and rt.outcome is not None:
            done.append(rt)
    return done


def drain(rt: RunningTrial, sampler: TelemetrySampler | None) -> None:
    """Read what the child sent before it exited (its result may still be buffered), then
    close its pipe. A broken frame at this point only loses what followed it."""
    if rt.connection_open:
        try:
            for message in rt.connection.receive():
                _handle(rt, message, sampler)
        except ProtocolError as exc:
            if rt.protocol_error is None:
                rt.protocol_error = str(exc)
    rt.connection_open = False
    rt.connection.close()


def _handle(rt: RunningTrial, message: tuple[Any, ...], sampler: TelemetrySampler | None) -> None:
    kind = message[0]
    if kind == "call":
        _, method, args, kwargs = message
        _answer(rt, method, args, kwargs)
    elif kind == "started":  # hpo.startup_s is written with the trial's other results
        rt.started_at = time.monotonic()
    elif kind == "phase":
        rt.phase = message[1]
        if sampler is not None:
            sampler.set_phase(rt.slot.id, rt.phase)
    elif kind == "result":
        rt.outcome = message[1]
    # "ready": a first-wave worker's start-up ended after its first trial was handed over
    # (the run waited _FIRST_WAVE_WAIT_S for it, scheduler/_orchestrator.py): nothing to do.


def _answer(rt: RunningTrial, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    reply: tuple[str, Any]
    if method not in TRIAL_METHODS and method != ARTIFACT_CALL and method not in READ_CALLS:
        reply = ("err", AttributeError(f"trial.{method} is not available in an orchestrated trial"))
    elif method == "set_user_attr" and args and isinstance(args[0], str) \
            and args[0].startswith("hpo.") and args[0] not in OBJECTIVE_ATTRS:
        reply = ("err", ValueError(f"trial.set_user_attr({args[0]!r}): the 'hpo.' attributes "
                                   "are the orchestrator's; use another prefix"))
    else:
        try:
            reply = ("ok", record_artifact(rt, args) if method == ARTIFACT_CALL
                     else answer_read(rt.trial, method) if method in READ_CALLS
                     else _several_objectives(rt, method, args, kwargs)
                     if method in _PRUNING_CALLS and len(rt.trial.study.directions) > 1
                     else getattr(rt.trial, method)(*args, **kwargs))
            if method == "report":
                rt.last_step = int(args[1])
                rt.reports.append((rt.last_step, time.monotonic() - rt.spawned_at))
            elif method == "should_prune" and rt.first_decision_at is None:
                rt.first_decision_at = time.monotonic()
            elif method == "set_user_attr" and args and args[0] == "hpo.params_effective":
                rt.params_effective = args[1] if isinstance(args[1], dict) else None
            elif method == "set_user_attr" and args and args[0] == "hpo.opencl_platform":
                rt.opencl_platform = str(args[1])
            elif method == "set_user_attr" and args and args[0] == "hpo.device_choice":
                rt.device_choice = args[1] if isinstance(args[1], dict) else None
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another orchestrator reaped the trial while we were stopped: it is not ours.
            rt.reaped = True
            reply = ("err", RuntimeError(f"trial {rt.number} was finished by another "
                                         "orchestrator (its heartbeats had stopped)"))
        except StorageUnavailable:
            raise  # the orchestrator's trouble, not the trial's: the run stops, recovery follows
        except Exception as exc:  # the objective's misuse (bad range...) is its error
            reply = ("err", _sendable(exc))
    rt.connection.send(reply)


_PRUNING_CALLS = frozenset({"report", "should_prune"})


def _several_objectives(rt: RunningTrial, method: str, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> bool | None:
    """``report``/``should_prune`` in a multi-objective study, where Optuna's own raise: the
    report is stored as Optuna stores it (curves for status, report and step timing) and the
    answer is never prune, so one objective's code runs unchanged with pruning off
    (docs/DESIGN.md §3.9)."""
    if method == "should_prune":
        return False
    bound = inspect.signature(optuna.Trial.report).bind(None, *args, **kwargs).arguments
    step = int(bound["step"])
    if step < 0:
        raise ValueError(f"`{step=}` must be non-negative.")
    rt.trial.storage.set_trial_intermediate_value(rt.trial._trial_id, step, float(bound["value"]))
    return None


def _sendable(exc: Exception) -> Exception:
    """The exception itself when it pickles (the child re-raises it as it was), else a
    RuntimeError with its text."""
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
