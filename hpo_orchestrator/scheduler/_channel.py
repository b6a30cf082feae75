"""The orchestrator's side of the pipe to each child (the protocol: worker/_protocol.py).

Every read of a child's bytes happens here: :func:`serve` waits on all open connections at
once and handles what arrived; :func:`drain` reads what a child sent before it exited. A
child's ``suggest_*``/``report``/``should_prune``/``set_user_attr`` calls are answered by the
real ``optuna.Trial`` held in its RunningTrial.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from typing import Any

from hpo_orchestrator.db import StorageUnavailable
from hpo_orchestrator.scheduler._trial import RunningTrial
from hpo_orchestrator.telemetry import TelemetrySampler
from hpo_orchestrator.worker import TRIAL_METHODS

__all__ = ["drain", "serve"]


def serve(running: list[RunningTrial], timeout: float, sampler: TelemetrySampler | None) -> None:
    """Handle every message that arrives within ``timeout`` (sleep it when no pipe is open)."""
    by_connection = {rt.connection: rt for rt in running if rt.connection_open}
    if not by_connection:
        time.sleep(timeout)
        return
    for connection in wait(list(by_connection), timeout=timeout):
        rt = by_connection[connection]  # type: ignore[index]
        while rt.connection_open and rt.connection.poll():
            try:
                message = rt.connection.recv()
            except (EOFError, OSError):
                rt.connection_open = False
                break
            _handle(rt, message, sampler)


def drain(rt: RunningTrial, sampler: TelemetrySampler | None) -> None:
    """Read what the child sent before it exited (its result may still be buffered), then
    close its pipe."""
    while rt.connection_open:
        try:
            if not rt.connection.poll():
                break
            _handle(rt, rt.connection.recv(), sampler)
        except (EOFError, OSError):
            break
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


def _answer(rt: RunningTrial, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if method not in TRIAL_METHODS:
        reply: tuple[str, Any] = ("err", AttributeError(f"trial.{method} is not available "
                                                        "in an orchestrated trial"))
    else:
        try:
            reply = ("ok", getattr(rt.trial, method)(*args, **kwargs))
            if method == "report":
                rt.last_step = int(args[1])
                rt.reports.append((rt.last_step, time.monotonic() - rt.spawned_at))
            elif method == "should_prune" and rt.first_decision_at is None:
                rt.first_decision_at = time.monotonic()
            elif method == "set_user_attr" and args and args[0] == "hpo.params_effective":
                rt.params_effective = args[1] if isinstance(args[1], dict) else None
            elif method == "set_user_attr" and args and args[0] == "hpo.opencl_platform":
                rt.opencl_platform = str(args[1])
        except StorageUnavailable:
            raise  # the orchestrator's trouble, not the trial's: the run stops, recovery follows
        except Exception as exc:  # the objective's misuse (bad range...) is its error
            reply = ("err", exc)
    try:
        rt.connection.send(reply)
    except OSError:
        rt.connection_open = False
