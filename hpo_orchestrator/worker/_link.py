"""The child's end of the pipe, shared by every thread of the objective.

An objective may call its trial from several threads (DataLoader workers' callbacks, thread
pools): each request and its reply are one exchange under a lock, so a reply reaches the
thread that asked; every frame is written whole under a second lock, so a large
``set_user_attr`` never interleaves with a ``phase`` message. Exchanges stop when the trial
ends (:meth:`Link.close_trial`): a thread still calling after that gets an error, and in
reuse mode no stray bytes reach the next trial.
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

    def fileno(self) -> int:
        return self._connection.fileno()

    def send(self, message: Any) -> None:
        with self._write:
            self._connection.send(message)

    def call(self, trial: int, message: Any) -> Any:
        """Send a request for ``trial`` and return the orchestrator's reply to it."""
        with self._exchange:
            if self._trial != trial:
                raise TrialEnded(f"trial {trial} has ended; its trial object cannot be used "
                                 "any more (a thread outlived the objective?)")
            self.send(message)
            return self._connection.recv()

    def open_trial(self, trial: int) -> None:
        with self._exchange:
            self._trial = trial

    def close_trial(self) -> None:
        """Wait for an exchange in flight, then refuse new ones: the result goes next."""
        with self._exchange:
            self._trial = None

    def recv_job(self) -> Any:
        """The next job (reuse mode), read while no exchange can be in flight."""
        with self._exchange:
            return self._connection.recv()

    def close(self) -> None:
        self._connection.close()
