"""Entry point of a trial's child process: ``python -m hpo_orchestrator.worker FD``.

The orchestrator fixed this process's environment before the interpreter started
(CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, thread counts, OpenCL registration), so nothing
here has to undo what an import might already have initialised.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import gc
import importlib
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import optuna

from hpo_orchestrator.config import CustomObjectiveConfig, ObjectiveConfig
from hpo_orchestrator.worker import _runtime as runtime
from hpo_orchestrator.worker._env import begin_trial
from hpo_orchestrator.worker._link import Link
from hpo_orchestrator.worker._protocol import Job, Prepare, TrialOutcome
from hpo_orchestrator.worker._proxy import TrialProxy
from hpo_orchestrator.worker._reaping import become_subreaper, collect, has_children

__all__ = ["import_target", "main"]

BUILTIN_OBJECTIVES = {
    "lightgbm": "hpo_orchestrator.objectives.lightgbm:LightGBMObjective",
    "torch_mlp": "hpo_orchestrator.objectives.torch_mlp:TorchMLPObjective",
}


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask the kernel to SIGKILL us when the orchestrator dies, so no orphan trains on (an
    objective may ignore SIGTERM). If it died before we asked, go now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


_sigint_received = False  # a real SIGINT reached this process (not a raise in the objective)


def _on_sigint(signum: int, frame: Any) -> None:
    """SIGINT as Python's default (KeyboardInterrupt), remembered: whoever sent it stopped
    the trial from outside, so the process ends by it ('killed'); a KeyboardInterrupt the
    objective's own code raised is its failure like any exception."""
    global _sigint_received
    _sigint_received = True
    signal.default_int_handler(signum, frame)


def _failure(exc: BaseException) -> TrialOutcome:
    """The objective's (or its setup's) exception, reported: a KeyboardInterrupt too, unless
    a SIGINT sent to this process raised it (then it ends the process)."""
    if isinstance(exc, KeyboardInterrupt) and _sigint_received:
        raise exc
    reason = "oom" if is_oom(exc) else "disk_full" if is_disk_full(exc) else "exception"
    return TrialOutcome(kind="error", fail_reason=reason, error=last_line(exc),
                        traceback=traceback.format_exc())


def import_target(target: str) -> Any:
    """``package.module:attribute`` -> the attribute."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute)


def build_objective(config: ObjectiveConfig) -> Callable[[Any], Any]:
    """The callable for this objective config; built-ins are classes taking their config."""
    if isinstance(config, CustomObjectiveConfig):
        if config.setup:
            import_target(config.setup)()
        return import_target(config.target)  # type: ignore[no-any-return]
    factory = import_target(BUILTIN_OBJECTIVES[config.name])
    return factory(config)  # type: ignore[no-any-return]


def is_oom(exc: BaseException) -> bool:
    """CUDA (torch) or OpenCL/LightGBM out-of-memory, or a MemoryError."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ in ("OutOfMemoryError", "CUDAOutOfMemoryError"):
        return True
    text = str(exc).lower()
    if "cuda out of memory" in text or "cl_mem_object_allocation_failure" in text:
        return True
    # "out of memory" alone from a runtime (torch's RuntimeError, LightGBM's error), not in any
    # message: a ValueError("... ran out of memory slots") is the objective's error, no OOM
    return "out of memory" in text and (isinstance(exc, RuntimeError)
                                        or type(exc).__module__ != "builtins")


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = ("no space left on device", "disk quota exceeded")


def is_disk_full(exc: BaseException) -> bool:
    """A write the file system refused for want of space or quota, raised as such or wrapped
    (a library's own error around the OSError, or only its text: torch.save's RuntimeError).
    The objective's code did nothing wrong: the trial's log, in the run folder, or its own
    files could not be written; the same params succeed once there is room."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(current).lower() for text in _DISK_FULL_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


ERROR_CHARS = 1000  # of hpo.error: one line for status and the progress lines (the traceback has all)


def last_line(exc: BaseException) -> str:
    """The error in one line: its type and the first line of its message (SQLAlchemy's last
    line is a 'Background on this error' link, a multi-line message's cause comes first), or
    the last where the message holds a traceback (a remote worker's, after a header line of
    its own, ends with its error)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    remote = any(line.startswith(("Traceback", 'File "')) for line in lines)
    line = lines[-1] if lines and remote else lines[0] if lines else ""
    text = f"{type(exc).__name__}: {line}".rstrip(": ")
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 3] + "..."


def check_value(value: Any) -> float | tuple[float, ...]:
    """The objective's return value as a float, or as a tuple of floats (one per objective of
    a multi-objective study: the orchestrator checks their count), or ValueError saying what
    was wrong."""
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) == 1:  # numpy, torch
        values = list(value)
        if not values:
            raise ValueError("objective returned an empty sequence; it must return a number "
                             "per objective")
        return tuple(_number(v, f"value {i} of its {len(values)}") for i, v in enumerate(values))
    return _number(value, "")


def _number(value: Any, which: str) -> float:
    """As plain Optuna's ``study.optimize``: anything ``float()`` reads, Python's ``True`` and
    numpy's ``np.True_`` alike (1.0); NaN fails the trial (Optuna's too). Unlike Optuna, +-inf
    fails it as well: status --json, the tally's means and the report's charts keep finite
    numbers (docs/OBJECTIVES.md, "What a trial's process cannot do to the run")."""
    what = f"objective returned {which + ' ' if which else ''}"
    if value is None:
        raise ValueError(f"{what}None; it must return a number")
    numeric = isinstance(value, (int, float)) or hasattr(value, "__float__")  # numpy, torch
    if isinstance(value, str) or not numeric:
        raise ValueError(f"{what}{type(value).__name__}; it must return a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what}{number}; it must return a finite number")
    return number


def run_trial(link: Link, job: Job, objective: Callable[[Any], Any]) -> TrialOutcome:
    trial = TrialProxy(link, job.trial_number, study_name=job.study_name,
                       directions=job.directions, datetime_start=job.datetime_start)
    link.send(("started",))
    try:
        value = check_value(objective(trial))
    except optuna.TrialPruned:
        return TrialOutcome(kind="pruned")
    except (Exception, KeyboardInterrupt) as exc:  # the objective's own failure, never fatal here
        return _failure(exc)
    return TrialOutcome(kind="value", value=value)


def _redirect_output(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so native libraries'
    output too) to the trial's own log, appending (scheduler/_logs.py rotates it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _begin(job: Job) -> None:
    """Per-trial state a reused process must not carry over from its previous trial."""
    if job.log_path:
        _redirect_output(job.log_path)
    begin_trial(job.trial_number, job.attempt, job.num_threads)
    runtime._phase_stack.clear()
    runtime._artifact_store = job.artifact_store


def _release_trial_memory() -> None:
    """Give back what the finished trial held, before the next one starts in this process."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _build(config: ObjectiveConfig, reuse: bool) -> Callable[[Any], Any]:
    """Imports and the objective's setup: once per process."""
    objective = build_objective(config)
    if reuse:
        # What exists now (modules, the setup's data) lives as long as the process: freezing
        # it keeps the full collection between trials to the trial's own objects (about 50 ms
        # -> under 1 ms per trial with torch imported). A fresh process runs one trial and
        # never collects between trials: nothing to do.
        gc.collect()
        gc.freeze()
    return objective


def _prepare(link: Link, request: Prepare) -> tuple[Callable[[Any], Any] | None, TrialOutcome | None]:
    """Start-up before any trial (a first-wave worker, a spare): the objective, or the failure
    its first trial reports. The pipe stays quiet meanwhile (a ``phase()`` in the setup is not
    sent): nobody reads it until a trial is handed over, and an idle worker that wrote would
    be taken for broken; the only message is ``("ready",)`` afterwards, when asked for."""
    runtime._attach(None)
    try:
        return _build(request.objective, reuse=True), None
    except (Exception, KeyboardInterrupt) as exc:
        return None, _failure(exc)
    finally:
        runtime._attach(link)


def _append_startup_log(path: str) -> None:
    """A spare's start-up output (imports, the setup's prints) goes into its first trial's
    log, where a worker started for the trial would have written it."""
    try:
        with open(path, "rb") as startup:
            text = startup.read()
        os.unlink(path)
    except OSError:
        return
    if text:
        sys.stdout.flush()
        with open(1, "wb", closefd=False) as out:
            out.write(b"[hpo-orchestrator] this worker started up before the trial was asked; "
                      b"its start-up output:\n" + text)


THREADS_GRACE_S = 10.0  # a fresh child waits this long for threads its trial left running


def _leave(deadline: float) -> None:
    """A fresh child's end: Python's own shutdown (it wakes idle executors, joins threads,
    runs exit handlers), bounded by a daemon watchdog that ends the process at ``deadline``."""
    def _end() -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)

    threading.Thread(target=_end, name="hpo-leave", daemon=True).start()


def main(argv: list[str]) -> int:
    """``FD [ORCHESTRATOR_PID]``: the socket to the orchestrator, and who it is."""
    _die_with_parent(int(argv[1]) if len(argv) > 1 else None)
    signal.signal(signal.SIGINT, _on_sigint)
    # What the trials start stays our descendant (orphans come to us), so "no child" at a
    # trial's end means nothing left running (worker/_reaping.py).
    subreaper = become_subreaper() is not None
    killed: set[int] = set()  # leftovers the orchestrator killed, to collect
    link = Link(Connection(int(argv[0])))
    runtime._attach(link)
    objective: Callable[[Any], Any] | None = None
    early: TrialOutcome | None = None  # a spare's start-up failed: its first trial says so
    startup_log: str | None = None  # a spare's start-up output, for its first trial's log
    home: str | None = None  # the folder its first trial started in: each later one does too
    while True:
        try:
            message: Job | Prepare | None = link.recv_job()
        except EOFError:  # the orchestrator closed our pipe: nothing more to do
            return 0
        if message is None:
            return 0
        if isinstance(message, Prepare):
            objective, early = _prepare(link, message)
            startup_log = message.log_path
            if message.announce:
                link.send(("ready",))
            continue
        job = message
        _begin(job)
        if startup_log is not None:
            _append_startup_log(startup_log)
            startup_log = None
        killed.update(job.collect)
        link.open_trial(job.trial_number)
        try:
            if early is not None:
                outcome, early = early, None
            else:
                if objective is None:  # imports and the objective's setup: once per process
                    objective = _build(job.objective, job.reuse)
                if home is None:
                    home = os.getcwd()
                else:  # a trial that changed folder left the next one elsewhere
                    with contextlib.suppress(OSError):  # gone: the trial starts where it is
                        os.chdir(home)
                outcome = run_trial(link, job, objective)
        except (Exception, KeyboardInterrupt) as exc:  # before the objective ran (import, setup)
            outcome = _failure(exc)
        ended = time.time()  # before anything that may wait for the orchestrator
        link.close_trial()  # a call in flight from another thread completes first
        killed = collect(killed)
        outcome = dataclasses.replace(outcome, children=not subreaper or has_children(),
                                      ended=ended)
        link.send(("result", outcome))
        if not job.reuse:
            link.close()
            _leave(time.monotonic() + THREADS_GRACE_S)
            return 0
        _release_trial_memory()
