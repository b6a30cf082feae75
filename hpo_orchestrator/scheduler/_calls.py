"""Answering the children: what the loop does with the messages each child's Channel hands
out (the bytes: _channel.py).

:func:`serve` waits on all open channels at once and handles what arrived; :func:`drain`
reads what a child sent before it exited. A child's
``suggest_*``/``report``/``should_prune``/``set_user_attr`` calls are answered by the real
``optuna.Trial`` held in its RunningTrial; ``save_artifact``'s by scheduler/_artifact_meta.py.
A child that broke the protocol fails its trial alone (docs/DESIGN.md §3.8).

A child's reads of its trial and study (worker/_protocol.READ_CALLS: :func:`answer_read`) are
asked for when the objective reads them rather than sent with every Job: the study's attrs
may change while the trial runs (another host, ``enqueue``), and ``relative_params`` costs a
sampler call that most objectives never make. The answers are plain values (dicts of JSON
values, parameter values), as every reply.
"""

from __future__ import annotations

import inspect
import pickle
import selectors
import time
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from hpo_orchestrator import keys
from hpo_orchestrator.db import StorageUnavailable
from hpo_orchestrator.scheduler._artifact_meta import record_artifact
from hpo_orchestrator.scheduler._channel import ProtocolError
from hpo_orchestrator.scheduler._trial import RunningTrial
from hpo_orchestrator.telemetry import TelemetrySampler
from hpo_orchestrator.worker import ARTIFACT_CALL, OBJECTIVE_ATTRS, READ_CALLS, TRIAL_METHODS

__all__ = ["answer_read", "drain", "ended", "serve"]


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
        _, method, args, kwargs, *tag = message
        _answer(rt, method, args, kwargs, tag[0] if tag else None)
    elif kind == "started":  # hpo.startup_s is written with the trial's other results
        rt.started_at = time.monotonic()
    elif kind == "phase":
        rt.phase = message[1]
        if sampler is not None:
            sampler.set_phase(rt.slot.id, rt.phase)
    elif kind == "result":
        rt.outcome = message[1]
    elif kind == "ready":  # a first-wave worker's start-up ended after its first trial was
        rt.worker.starting = False  # handed over (scheduler/orchestrator.py's wait ran out)
        rt.in_setup = False


def _answer(rt: RunningTrial, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
            tag: int | None) -> None:
    """Answer a call, echoing its tag: the child's Link drops a reply whose request nobody
    waits for, so it never reaches another call or the next trial (worker/_link.py)."""
    reply = _refused(rt, method, args, kwargs) or _made(rt, method, args, kwargs)
    rt.connection.send((*reply, tag))


def _refused(rt: RunningTrial, method: str, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[str, Any] | None:
    """The error for a call the orchestrator does not make: not a trial call, an ``hpo.`` attr
    that is not the objective's, a step the storage cannot keep; None for the others."""
    if method not in TRIAL_METHODS and method != ARTIFACT_CALL and method not in READ_CALLS:
        return ("err", AttributeError(f"trial.{method} is not available in an orchestrated trial"))
    if method == "set_user_attr" and args and isinstance(args[0], str) \
            and args[0].startswith("hpo.") and args[0] not in OBJECTIVE_ATTRS:
        return ("err", ValueError(f"trial.set_user_attr({args[0]!r}): the 'hpo.' attributes "
                                  "are the orchestrator's; use another prefix"))
    if method == "report" and (too_large := _step_out_of_range(rt, args, kwargs)):
        return ("err", ValueError(too_large))
    if rt.space is not None and method.startswith("suggest_") \
            and (changed := rt.space.check(method, args, kwargs)):
        return ("err", ValueError(changed))  # the run stops with it (exit 2)
    return None


def _made(rt: RunningTrial, method: str, args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> tuple[str, Any]:
    """Make the call here, on the trial's real ``optuna.Trial`` (or its stand-in), and keep
    what the loop reads of it; its error is the objective's, sent back to it."""
    try:
        value = _call(rt, method, args, kwargs)
        _keep(rt, method, args, kwargs)
        return ("ok", value)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Another orchestrator reaped the trial while we were stopped: it is not ours.
        rt.reaped = True
        return ("err", RuntimeError(f"trial {rt.number} was finished by another "
                                    "orchestrator (its heartbeats had stopped)"))
    except StorageUnavailable:
        raise  # the orchestrator's trouble, not the trial's: the run stops, recovery follows
    except Exception as exc:  # the objective's misuse (bad range...) is its error
        return ("err", _sendable(exc))


def _call(rt: RunningTrial, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Who answers: the artifact record, a read, pruning with several objectives (off), or
    the trial itself."""
    if method == ARTIFACT_CALL:
        return record_artifact(rt, args)
    if method in READ_CALLS:
        return answer_read(rt.trial, method)
    if method in _PRUNING_CALLS and len(rt.trial.study.directions) > 1:
        return _several_objectives(rt, method, args, kwargs)
    return getattr(rt.trial, method)(*args, **kwargs)


def _keep(rt: RunningTrial, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """What the loop keeps of a call made: a report's step and time, the first pruning
    decision, and the attrs the trial's end records (_KEPT_ATTRS)."""
    if method == "report":
        rt.last_step = int(_REPORT.bind(None, *args, **kwargs).arguments["step"])
        rt.reports.append((rt.last_step, time.monotonic() - rt.spawned_at))
    elif method == "should_prune" and rt.first_decision_at is None:
        rt.first_decision_at = time.monotonic()
    elif method == "set_user_attr" and args and isinstance(args[0], str) and args[0] in _KEPT_ATTRS:
        _KEPT_ATTRS[args[0]](rt, args[1])


def _keep_params_effective(rt: RunningTrial, value: Any) -> None:
    rt.params_effective = value if isinstance(value, dict) else None


def _keep_opencl_platform(rt: RunningTrial, value: Any) -> None:
    rt.opencl_platform = str(value)


def _keep_device_choice(rt: RunningTrial, value: Any) -> None:
    rt.device_choice = value if isinstance(value, dict) else None


# The objective's attrs the loop keeps on the RunningTrial as they are set.
_KEPT_ATTRS: dict[str, Callable[[RunningTrial, Any], None]] = {
    keys.PARAMS_EFFECTIVE: _keep_params_effective, keys.OPENCL_PLATFORM: _keep_opencl_platform,
    keys.DEVICE_CHOICE: _keep_device_choice}


_PRUNING_CALLS = frozenset({"report", "should_prune"})
_REPORT = inspect.signature(optuna.Trial.report)  # read once: each report binds its args to it


def _step_out_of_range(rt: RunningTrial, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Why a report's step cannot be stored ('' where it can). Optuna keeps it in an INTEGER
    column: 64 bits on sqlite, 32 on PostgreSQL and MySQL. One out of range failed the write
    of the trial's end, and the run with it, leaving its trials RUNNING."""
    try:
        step = int(_REPORT.bind(None, *args, **kwargs)
                   .arguments["step"])
    except (TypeError, ValueError, OverflowError, KeyError):
        return ""  # Optuna's own report says what is wrong with it
    engine = getattr(rt.trial.storage, "engine", None)
    bits = 64 if engine is None or engine.dialect.name == "sqlite" else 32
    if step < 2 ** (bits - 1):
        return ""
    return (f"trial.report: step {step} is too large: the storage keeps a step as a {bits}-bit "
            f"integer (at most {2 ** (bits - 1) - 1})")


def _several_objectives(rt: RunningTrial, method: str, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> bool | None:
    """``report``/``should_prune`` in a multi-objective study, where Optuna's own raise: the
    report is stored as Optuna stores it (curves for status, report and step timing) and the
    answer is never prune, so one objective's code runs unchanged with pruning off
    (docs/DESIGN.md §3.9)."""
    if method == "should_prune":
        return False
    bound = _REPORT.bind(None, *args, **kwargs).arguments
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


def answer_read(trial: optuna.Trial, what: str) -> dict[str, Any]:
    if what == "relative_params":
        return dict(trial.relative_params)
    if what == "study.user_attrs":
        return dict(trial.study.user_attrs)
    if what == "study.system_attrs":
        return dict(trial.storage.get_study_system_attrs(trial.study._study_id))
    raise ValueError(f"no such read: {what!r}")
