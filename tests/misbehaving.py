"""Trials that misbehave towards the orchestrator, for tests/scheduler/test_reliability_children.py:
importable in child processes as ``tests.misbehaving:NAME``.

Each breaks a rule of the pipe or the trial API the way a careless (or unlucky) objective
could; the orchestrator must fail that trial alone and carry on.
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from hpo_orchestrator.worker import orchestrator_link, phase

__all__ = ["chaos", "misbehave", "stopwatch"]

class _RunsCode:
    """Pickles as a call of os._exit(3): unpickled in the orchestrator, it would end it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os._exit, (3,))


def _frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def _note(variable: str, text: str) -> None:
    """A line in the file $variable names (if set): a test waits for it instead of sleeping."""
    path = os.environ.get(variable)
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def _pipe_fd() -> int:
    """The child's end of its pipe to the orchestrator, as a careless objective could find it."""
    link = orchestrator_link()
    assert link is not None, "not in an orchestrated child"
    return link.fileno()


def _threads(trial: Any) -> None:
    """3 threads x 20 suggest_float on disjoint ranges, 4 threads x 40 KB set_user_attr."""
    wrong: list[str] = []

    def suggest(k: int) -> None:
        for i in range(20):
            value = trial.suggest_float(f"t{k}_{i}", 10.0 * k, 10.0 * k + 1)
            if not 10.0 * k <= value <= 10.0 * k + 1:
                wrong.append(f"t{k}_{i}={value}")

    def attrs(k: int) -> None:
        for i in range(3):
            trial.set_user_attr(f"test.blob{k}_{i}", str(k) * 40_000)

    workers = [threading.Thread(target=suggest, args=(k,)) for k in range(3)]
    workers += [threading.Thread(target=attrs, args=(k,)) for k in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if wrong:
        raise AssertionError(f"replies reached the wrong thread: {wrong[:3]}")


def _grandchildren(trial: Any) -> None:
    """A plain subprocess, one in its own session, and a double-forked one, all left running;
    their pids are recorded in ``test.grandchildren``."""
    plain = subprocess.Popen(["sleep", "600"])
    session = subprocess.Popen(["sleep", "601"], start_new_session=True)
    trial.set_user_attr("test.grandchildren", [plain.pid, session.pid, double_fork("602")])


def double_fork(seconds: str) -> int:
    """``sleep seconds`` started by a double fork whose middle process (in a new session)
    exits at once and is waited for: the sleeper is an orphan, re-parented to the nearest
    subreaper. Returns its pid."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            os.execvp("sleep", ["sleep", seconds])
        os._exit(0)
    os.waitpid(middle, 0)
    os.close(write_end)
    orphan = int(os.read(read_end, 32))
    os.close(read_end)
    return orphan


_left: list[int] = []  # what this worker's trials left running (fork_at_end), for left_gone


def _fork_at_end(trial: Any) -> None:
    """Right before the objective returns: a double fork whose middle process is waited for,
    so the grandchild is an orphan (re-parented to the worker, a subreaper) when the trial
    ends. Its pid is in ``test.grandchildren``."""
    orphan = double_fork("603")
    _left.append(orphan)
    trial.set_user_attr("test.grandchildren", [orphan])


def _left_gone(trial: Any) -> None:
    """What earlier trials of this worker left: ``test.left_running``, those still running
    after up to 5 s (the orchestrator kills them at their trial's end), and
    ``test.left_existing``, those that still exist at all (killed but not yet collected)."""
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 5.0
    while any(running(p) for p in _left) and time.monotonic() < deadline:
        time.sleep(0.05)
    trial.set_user_attr("test.left_running", [p for p in _left if running(p)])
    trial.set_user_attr("test.left_existing", [p for p in _left if psutil.pid_exists(p)])


def _stray_thread(trial: Any) -> None:
    """A thread that outlives the objective and still calls its trial and phase()."""
    def late() -> None:
        time.sleep(0.3)
        try:
            trial.suggest_float("late", 0.0, 1.0)
        except Exception:  # the trial has ended: refused, nothing sent
            pass
        with phase("late"):
            pass

    threading.Thread(target=late, daemon=True).start()


def misbehave(trial: Any) -> float:
    """Breaks the rules in one of the ways HPO_TEST_MISBEHAVE lists (comma-separated, picked
    by trial number), then goes on as a normal trial would (or sleeps, where the parent
    must act). Modes: ok, partial, junk, oversized, unpicklable, runs_code, threads,
    grandchildren, hpo_attr, hpo_attr_raw, stray_thread, unread_call (a call frame written
    to the pipe directly, its reply never read; _then_suggest: a proxied call follows),
    stop_orchestrator (SIGSTOPs its parent as its last act, HPO_TEST_STOP_NOTES says when),
    lingering_thread (a thread that is no daemon, left running), wanders (changes folder),
    ignore_term, signals_its_group (SIGTERM to its process group), keyboard_interrupt
    (raised by the objective's own code), raise (a plain error), sleep (until stopped),
    fork_at_end (a double fork as the last thing before returning), left_gone (checks what
    fork_at_end left in this worker)."""
    modes = os.environ.get("HPO_TEST_MISBEHAVE", "ok").split(",")
    mode = modes[trial.number % len(modes)]
    x = trial.suggest_float("x", 0.0, 1.0)
    fd = _pipe_fd()
    if mode == "partial":  # a frame's header and part of its body, then nothing (not even
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SIGTERM ends it)
        os.write(fd, b"\x00\x01\x00\x00" + b"0123456789")
        _note("HPO_TEST_PARTIAL_NOTES", f"{trial.number}")  # the test's signal: it is written
        time.sleep(3600)
    elif mode == "junk":  # a frame of 16 bytes that are no pickle, then a normal call
        os.write(fd, _frame(b"\xde\xad\xbe\xef" * 4))
        trial.suggest_float("y", 0.0, 1.0)
        time.sleep(3600)
    elif mode == "oversized":  # a header announcing 2 GiB
        os.write(fd, struct.pack("!i", 0x7FFFFFF0) + b"x" * 1000)
        time.sleep(3600)
    elif mode == "unpicklable":  # names a module that does not exist
        os.write(fd, _frame(b"cnonexistent_module_of_hpo_tests\nThing\n)R."))
        time.sleep(3600)
    elif mode == "runs_code":
        os.write(fd, _frame(pickle.dumps(("phase", _RunsCode()))))
        time.sleep(3600)
    elif mode == "threads":
        _threads(trial)
    elif mode == "grandchildren":
        _grandchildren(trial)
    elif mode == "hpo_attr":  # raises: the namespace is the orchestrator's
        trial.set_user_attr("hpo.retried", True)
    elif mode == "hpo_attr_raw":  # past the proxy: the orchestrator refuses it too
        link = orchestrator_link()
        assert link is not None
        status, error = link.call(
            trial.number, ("call", "set_user_attr", ("hpo.retried", True), {}))
        if status == "err":
            raise error
    elif mode == "keyboard_interrupt":
        raise KeyboardInterrupt("raised by the objective")
    elif mode == "raise":
        raise RuntimeError("boom from the objective")
    elif mode == "stop_orchestrator":  # its last act: SIGSTOP the orchestrator (a test resumes it)
        _note("HPO_TEST_STOP_NOTES", f"{trial.number}")
        os.kill(os.getppid(), signal.SIGSTOP)
    elif mode in ("unread_call", "unread_call_then_suggest"):  # a call frame of its own, its
        os.write(fd, _frame(pickle.dumps(("call", "suggest_float", ("y", 0.0, 1.0), {}))))
        if mode == "unread_call":  # reply never read: it waits for the worker's next job
            return x
        z = trial.suggest_float("z", 5.0, 6.0)  # through the proxy: must get its own reply
        if not 5.0 <= z <= 6.0:
            raise AssertionError(f"suggest_float('z', 5, 6) answered {z}: another call's reply")
    elif mode == "signals_its_group":  # SIGTERM to its whole process group (itself immune)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.kill(0, signal.SIGTERM)
        os.killpg(os.getpgrp(), signal.SIGTERM)
    elif mode == "sleep":
        time.sleep(3600)
    elif mode == "stray_thread":
        _stray_thread(trial)
    elif mode == "wanders":  # where it started, then a folder of its own for the next trial
        trial.set_user_attr("test.cwd", os.getcwd())
        os.makedirs(f"wandered-{trial.number}")
        os.chdir(f"wandered-{trial.number}")
    elif mode == "lingering_thread":  # no daemon, and it never ends: Python waits for it
        threading.Thread(target=time.sleep, args=(3600,)).start()
    elif mode == "left_gone":
        _left_gone(trial)
    elif mode == "ignore_term":  # a trial (and its subprocess) that ignore SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        trial.set_user_attr("test.grandchildren", [child.pid])
        time.sleep(3600)
    elif mode == "fork_at_end":  # the last thing before returning
        _fork_at_end(trial)
    return x


def stopwatch(trial: Any) -> float:
    """HPO_TEST_STEPS reports HPO_TEST_STEP_S apart (each waits for the orchestrator)."""
    x = trial.suggest_float("x", 0.0, 1.0)
    for step in range(1, int(os.environ.get("HPO_TEST_STEPS", "10")) + 1):
        time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.5")))
        trial.report(x, step)
    return x


def chaos(trial: Any) -> float:
    """Fails in a different way per trial number (a chaos study for the reliability tests)."""
    trial.suggest_float("x", 0.0, 1.0)
    mode = ("ok", "raise", "abort", "hang", "nan", "none", "memory", "sigkill")[trial.number % 8]
    if mode == "raise":
        raise RuntimeError("boom from the objective")
    if mode == "abort":
        os.abort()
    if mode == "hang":
        time.sleep(3600)
    if mode == "nan":
        return math.nan
    if mode == "none":
        return None  # type: ignore[return-value]
    if mode == "memory":
        raise MemoryError("could not allocate")
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0
