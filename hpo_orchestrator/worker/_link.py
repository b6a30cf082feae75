"""The child's end of the pipe, shared by every thread of the objective.

An objective may call its trial from several threads (DataLoader workers' callbacks, thread
pools): each request and its reply are one exchange under a lock, so a reply reaches the
thread that asked; every frame is written whole under a second lock, so a large
``set_user_attr`` never interleaves with a ``phase`` message. Exchanges stop when the trial
ends (:meth:`Link.close_trial`): a thread still calling after that gets an error, and in
reuse mode no stray bytes reach the next trial.

Each request carries a tag (a number unique in this process) that its reply echoes: a reply
nobody waits for (the objective wrote a call frame to the pipe itself and never read the
answer) is dropped where it is met, by a later exchange or by the wait for the next job, so
it can neither answer another call nor be taken for the next trial's job (docs/DESIGN.md §3.8).
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Link", "TrialEnded"]


class TrialEnded(RuntimeError):
    """The trial this proxy belonged to has ended; its object cannot be used any more."""


class Link:
    """Thread-safe child end of a socketpair (a ``multiprocessing`` Connection underneath)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._exchange = threading.Lock()  # one request/reply pair at a time
        self._write = threading.Lock()  # one frame at a time
        self._trial: int | None = None  # the trial whose exchanges are allowed
        self._tag = 0  # the last request's tag

    def fileno(self) -> int:
        return self._connection.fileno()

    def send(self, message: Any) -> None:
        with self._write:
            self._connection.send(message)

    def call(self, trial: int, message: tuple[Any, ...]) -> tuple[str, Any]:
        """Send a request (``("call", method, args, kwargs)``) for ``trial``; the
        orchestrator's reply to it, ``(status, payload)``."""
        with self._exchange:
            if self._trial != trial:
                raise TrialEnded(f"trial {trial} has ended; its trial object cannot be used "
                                 "any more (a thread outlived the objective?)")
            self._tag += 1
            self.send((*message, self._tag))
            while True:  # a reply to a request nobody waits for is dropped
                reply = self._connection.recv()
                if isinstance(reply, tuple) and len(reply) == 3 and reply[2] == self._tag:
                    return reply[0], reply[1]

    def open_trial(self, trial: int) -> None:
        with self._exchange:
            self._trial = trial

    def close_trial(self) -> None:
        """Wait for an exchange in flight, then refuse new ones: the result goes next."""
        with self._exchange:
            self._trial = None

    def recv_job(self) -> Any:
        """The next job (reuse mode), read while no exchange can be in flight; replies left
        unread by the trial before (tuples: a job never is one) are dropped."""
        with self._exchange:
            while isinstance(message := self._connection.recv(), tuple):
                pass
            return message

    def close(self) -> None:
        self._connection.close()
