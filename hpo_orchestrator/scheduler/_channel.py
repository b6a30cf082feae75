"""The orchestrator's side of the pipe to each child, as bytes (the protocol:
worker/_protocol.py; what the messages do: _calls.py).

Every read of a child's bytes happens here, and none of them blocks: a :class:`Channel`
reads what its non-blocking socket holds, keeps a partial frame for later, and hands out
only complete, well-formed messages.

A child runs the user's code, so its bytes are not trusted to be well-formed: a frame that
is too large, stalls half-way, does not unpickle, names a class that is not a message, or is
not a message is a :class:`ProtocolError`. It fails that trial alone (``exception``, the
error starting with "protocol:") and the worker is replaced; the loop never waits for it.
"""

from __future__ import annotations

import io
import math
import pickle
import socket
import struct
import time
from typing import Any

from hpo_orchestrator.worker import TrialOutcome

__all__ = ["MAX_FRAME_BYTES", "Channel", "ProtocolError"]

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
    if kind == "call":  # the tag is optional: a reply to an untagged request reaches no one
        return (len(rest) in (3, 4) and isinstance(rest[0], str) and isinstance(rest[1], tuple)
                and isinstance(rest[2], dict) and all(isinstance(k, str) for k in rest[2])
                and (len(rest) == 3 or rest[3] is None
                     or (isinstance(rest[3], int) and not isinstance(rest[3], bool))))
    return False


def _well_formed_outcome(outcome: Any) -> bool:
    """What the loop will tell Optuna and write: a number for a value, a known reason."""
    if not isinstance(outcome, TrialOutcome):
        return False
    plain = all(v is None or isinstance(v, str) for v in (outcome.error, outcome.traceback)) \
        and isinstance(outcome.children, bool) and (outcome.ended is None or (
            isinstance(outcome.ended, (int, float)) and not isinstance(outcome.ended, bool)
            and math.isfinite(outcome.ended)))
    if outcome.kind == "value":
        values = outcome.value if isinstance(outcome.value, tuple) else (outcome.value,)
        return plain and bool(values) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in values)
    if outcome.kind == "error":
        return plain and outcome.fail_reason in ("exception", "oom", "disk_full")
    return plain and outcome.kind == "pruned"
