"""The signals that stop a run: SIGINT (Ctrl-C), SIGTERM (a service manager, Slurm, kill)
and SIGHUP (the terminal closed) all mean "end now, leave nothing RUNNING; the same command
resumes", exit 130.

Its own module, importing nothing heavy, so that ``hpo-orchestrator run`` handles them before
it imports Optuna and composes its configuration (start-up takes seconds).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "handling_stop_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def handling_stop_signals(handler: Callable[[int, FrameType | None], Any] | None = None,
                          ) -> Iterator[None]:
    """While inside, the stop signals call ``handler``; without one they raise
    KeyboardInterrupt as Ctrl-C does (start-up: nothing is running yet, so unwinding is the
    whole of stopping, and the caller reports it like a stopped run, exit 130, not 143).
    The previous handlers come back on leaving."""
    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler or interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
