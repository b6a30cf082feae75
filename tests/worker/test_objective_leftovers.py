"""What an objective leaves behind, and the text it raises: a fresh child's threads and
processes, threads its module starts in the orchestrator, passwords in long messages, other
libraries' out-of-memory errors, remote tracebacks (a review of 9e8f216: each failed there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import cli_env, run_cli, trial_rows
from tests.scheduler.test_channel import pipe  # noqa: F401  (the fixture)


def _module(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / "rv").mkdir(exist_ok=True)
    (tmp_path / "rv" / "__init__.py").write_text("")
    (tmp_path / "rv" / f"{name}.py").write_text(text)
    return f"objective.target=rv.{name}:objective"


def _run(tmp_path: Path, target: str, *args: str, timeout: float = 90) -> Any:
    return run_cli(tmp_path, "run", "objective=custom", target, "pruner=none", "sampler=random",
                   "scheduler.worker_mode=fresh", "scheduler.parallel=1", *args, timeout=timeout)


# --- 1. worker/_child.py _leave ------------------------------------------------------------

POOL = """
import atexit, concurrent.futures, os
_pool = concurrent.futures.ThreadPoolExecutor(2)   # a module's shared pool: idle workers, no daemons
def objective(trial):
    atexit.register(lambda: open(f"atexit-{trial.number}", "w").close())
    _pool.submit(lambda: 1).result()
    return trial.suggest_float("x", 0, 1)
"""


@pytest.mark.slow
def test_an_idle_thread_pool_neither_delays_a_fresh_trial_nor_skips_its_exit_handlers(
        tmp_path: Path) -> None:
    """Python's shutdown wakes a ThreadPoolExecutor's idle workers (threading._register_atexit)
    before it joins them: the child ended at once. _leave joins them first: they never end,
    so every trial holds its slot 10 s more, then os._exit skips every atexit handler
    (mlflow's end_run, a metrics client's flush). Before 9e8f216: 2.3 s; at it: 22 s."""
    result = _run(tmp_path, _module(tmp_path, "pool", POOL), "study.n_trials=2")
    assert result.code == 0, result.stderr
    # its exit handlers ran: the child ended as Python ends, not by os._exit after the grace
    assert sorted(p.name for p in tmp_path.glob("atexit-*")) == ["atexit-0", "atexit-1"]


CHAIN = """
import threading
def _tick():   # a periodic task that re-arms itself: each tick is a new Timer (no daemon)
    threading.Timer(0.5, _tick).start()
def objective(trial):
    _tick()
    return trial.suggest_float("x", 0, 1)
"""

NON_DAEMON_PROCESS = """
import multiprocessing, time
def objective(trial):   # multiprocessing's exit handler joins a process that is no daemon
    multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,)).start()
    return trial.suggest_float("x", 0, 1)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("name", "text"), [("chain", CHAIN), ("proc", NON_DAEMON_PROCESS)])
def test_a_fresh_child_that_never_exits_after_its_result_cannot_stall_the_run(
        tmp_path: Path, name: str, text: str) -> None:
    """_leave joins the threads alive when it looks, once: a thread that started the next one
    (a re-arming Timer) passes, and Python's shutdown then waits for the new one; a
    non-daemon multiprocessing.Process is joined by an exit handler. Either way the child
    never exits, and since the result is in, trial_timeout_s no longer counts: the run
    stalls for good (before 9e8f216 the timeout ended it, as FAIL, in 6 s)."""
    try:
        result = _run(tmp_path, _module(tmp_path, name, text), "study.n_trials=1",
                      "scheduler.trial_timeout_s=5", "scheduler.kill_grace_s=1", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the run was still waiting for a trial whose value was in after 60 s")
    assert result.code == 0, result.stderr
    assert [r["state"] for r in trial_rows(result.db)] == ["COMPLETE"]


# --- 2. runner.check_objective / cli.main ---------------------------------------------------

THREAD_AT_IMPORT = """
import threading, time
threading.Thread(target=time.sleep, args=(3600,)).start()   # no daemon (an SDK's sender, say)
def objective(trial):
    return trial.suggest_float("x", 0, 1)
"""


def test_a_config_error_after_an_import_that_started_a_thread_still_exits(tmp_path: Path) -> None:
    """IMPORT_THREADS is filled only after every check passed: a setup that is misspelt (or
    not callable, or whose module raises or sys.exits) prints 'error: ...' and exit 2 is
    returned, then Python waits for the target module's thread forever."""
    target = _module(tmp_path, "thr", THREAD_AT_IMPORT)
    try:
        result = run_cli(tmp_path, "run", "objective=custom", target,
                         "objective.setup=rv.thr:no_such_setup", "study.n_trials=1", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the CLI printed its error and then never exited")
    assert result.code == 2 and "no_such_setup" in result.stderr


@pytest.mark.slow
def test_main_called_in_process_returns_to_its_caller(tmp_path: Path) -> None:
    """main() is the console script's entry but also an API: tests, a notebook and Slurm's
    NodeRun (submitit pickles its return value) call it. After a run whose module started a
    thread, main os._exit()s the caller's whole process instead of returning; and since
    IMPORT_THREADS is never cleared, so does every later main() (status...) in it."""
    target = _module(tmp_path, "thr", THREAD_AT_IMPORT)
    script = ("import sys\nfrom hpo_orchestrator.cli import main\n"
              f"code = main(['run', 'objective=custom', '{target}', 'study.n_trials=1', "
              "'pruner=none', 'sampler=random'])\n"
              "print('returned', code, flush=True)\n"
              "import os; os._exit(0)\n")  # the test's own thread would keep it alive
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert "returned 0" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


# --- 3. errors.mask_passwords ---------------------------------------------------------------

@pytest.mark.parametrize("text", [
    # an IAM token as the password (AWS RDS: ~1 kB with a session token; Azure AD: 1.5-3 kB)
    "could not connect to postgresql://app:" + "T0k3n%2F" * 100 + "@db.example.com/hpo",
    # a shell default, as a .env file or docker-compose has it
    "storage.url: ${HPO_DB:-postgresql://me:s3cret@db/hpo}",
    "url=%22postgresql://me:s3cret@db/hpo%22",  # URL-encoded quotes
    "psql -dpostgresql://me:s3cret@db/hpo",
])
def test_a_password_the_old_pattern_masked_is_still_masked(text: str) -> None:
    """The new pattern caps a password at 512 characters and wants no letter, digit, '-',
    '.' or '+' before the scheme: each of these was masked before 9e8f216 and is not now."""
    from hpo_orchestrator.errors import mask_passwords

    masked = mask_passwords(text)
    assert "s3cret" not in masked and "T0k3n" not in masked, masked


# --- 4. worker/_child.py is_oom / last_line --------------------------------------------------

class XGBoostError(ValueError):  # xgboost.core.XGBoostError subclasses ValueError
    pass


class CatBoostError(Exception):  # _catboost.CatBoostError
    pass


class ResourceExhaustedError(Exception):  # tensorflow's OpError is an Exception
    pass


@pytest.mark.parametrize("exc", [
    XGBoostError("[10:00:00] src/common/device_helpers.cuh:431: Memory allocation error on "
                 "worker 0: std::bad_alloc: cudaErrorMemoryAllocation: out of memory"),
    CatBoostError("catboost/cuda/cuda_lib/cuda_base.h:281: CUDA error 2: out of memory"),
    ResourceExhaustedError("Out of memory while trying to allocate 8589934592 bytes."),
])
def test_a_gpu_library_out_of_memory_is_still_an_oom(exc: BaseException) -> None:
    """Each was an OOM (retried on a freer GPU) before 9e8f216; only RuntimeError and
    LightGBMError count now."""
    from hpo_orchestrator.worker._child import is_oom

    assert is_oom(exc)


class RayTaskError(Exception):
    pass


@pytest.mark.parametrize(("exc", "cause"), [
    (RayTaskError('ray::objective() (pid=4242, ip=10.0.0.2)\n  File "obj.py", line 9, in '
                  'objective\nValueError: lr must be positive'), "lr must be positive"),
    (RuntimeError("The following operation failed in the TorchScript interpreter.\n"
                  "Traceback of TorchScript (most recent call last):\n"
                  '  File "model.py", line 12, in forward\n'
                  "RuntimeError: shape '[4, 3]' is invalid for input of size 10"),
     "is invalid for input of size 10"),
])
def test_a_traceback_after_a_header_line_still_gives_its_error(exc: BaseException,
                                                               cause: str) -> None:
    """Only a message whose FIRST line starts with 'Traceback' gets its last line; a remote
    error with a header line (Ray's task error, TorchScript's) now shows the header alone."""
    from hpo_orchestrator.worker._child import last_line

    assert cause in last_line(exc)


# --- 5. scheduler/_calls.py (pre-existing) --------------------------------------------------

def test_a_report_with_step_as_keyword_is_answered_ok(pipe: Any) -> None:  # noqa: F811
    """Pre-existing: the report is stored, then rt.last_step = int(args[1]) raises IndexError
    and the objective is told its report failed. Unreachable through TrialProxy (it sends
    (value, step) positionally), reachable by a raw call frame."""
    from hpo_orchestrator.scheduler import _calls

    channel, child = pipe
    reports: list[Any] = []
    trial = SimpleNamespace(report=lambda *a, **k: reports.append((a, k)), number=0,
                            study=SimpleNamespace(directions=["minimize"]), storage=SimpleNamespace())
    rt = SimpleNamespace(trial=trial, connection=channel, number=0, reports=[], spawned_at=0.0,
                         space=None)
    _calls._answer(rt, "report", (0.5,), {"step": 5}, 1)  # type: ignore[arg-type]
    reply = child.recv()
    assert reports and reply[0] == "ok", reply
