"""Outcome rules (scheduler/_outcome.py) and the child's environment (worker/_env.py): pure
functions, no processes."""

from __future__ import annotations

import signal

import pytest
from optuna.trial import TrialState

from hpo_orchestrator.scheduler._outcome import Verdict, classify, keep_worker, retry_allowed, retry_attempt
from hpo_orchestrator.worker import TrialOutcome
from hpo_orchestrator.worker._child import is_oom
from hpo_orchestrator.worker._env import ChildEnv, begin_trial

ERROR = TrialOutcome(kind="error", fail_reason="oom", error="OutOfMemoryError: CUDA")


@pytest.mark.parametrize(("stop_reason", "outcome", "returncode", "oom", "expected"), [
    ("timeout", TrialOutcome(kind="value", value=1.0), -15, False,
     Verdict(TrialState.FAIL, None, "timeout", "ran past scheduler.trial_timeout_s=5.0")),
    (None, TrialOutcome(kind="value", value=0.5), 0, False, Verdict(TrialState.COMPLETE, 0.5)),
    ("interrupted", TrialOutcome(kind="pruned"), 0, False, Verdict(TrialState.PRUNED)),
    ("interrupted", None, -15, False,
     Verdict(TrialState.FAIL, None, "interrupted", "stopped by SIGINT/SIGTERM/SIGHUP")),
    (None, ERROR, 0, False, Verdict(TrialState.FAIL, None, "oom", "OutOfMemoryError: CUDA")),
    (None, None, -signal.SIGKILL, True,
     Verdict(TrialState.FAIL, None, "oom", "killed by the kernel OOM killer")),
    (None, None, -signal.SIGKILL, False,
     Verdict(TrialState.FAIL, None, "killed", "died by SIGKILL: last words")),
    (None, None, -signal.SIGSEGV, True,
     Verdict(TrialState.FAIL, None, "killed", "died by SIGSEGV: last words")),
    (None, None, 3, False,
     Verdict(TrialState.FAIL, None, "exception", "exited with code 3: last words")),
], ids=["timeout-wins", "value", "pruned-despite-stop", "interrupted", "child-error",
        "oom-killer", "killed", "segv-not-oom", "exit-code"])
def test_classify(stop_reason: str | None, outcome: TrialOutcome | None, returncode: int,
                  oom: bool, expected: Verdict) -> None:
    verdict = classify(stop_reason=stop_reason, outcome=outcome, returncode=returncode,
                       timeout_s=5.0, oom_killed=lambda: oom, log_tail=lambda: "last words")
    assert verdict == expected


class OutOfMemoryError(RuntimeError):
    """Named as torch.cuda.OutOfMemoryError is: the child tells it by its class name."""


@pytest.mark.parametrize(("exc", "expected"), [
    (MemoryError(), True),
    (OutOfMemoryError("CUDA error"), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),  # older torch, cuDNN
    (RuntimeError("[LightGBM] [Fatal] CL_MEM_OBJECT_ALLOCATION_FAILURE"), True),  # OpenCL
    (ValueError("bad learning rate"), False),
    (ValueError("the budget ran out of memory slots"), False),  # the user's words, not an OOM
    (RuntimeError("HIP out of memory"), True),
    (Exception("CUDA out of memory. Tried to allocate 2.00 GiB"), True),  # a wrapper's class
    (RuntimeError("CUDA error: device-side assert triggered"), False),
])
def test_is_oom(exc: BaseException, expected: bool) -> None:
    """What the child reports as 'oom' (retried on the GPU with most free memory)."""
    assert is_oom(exc) is expected


@pytest.mark.parametrize(("exc", "line"), [
    (ValueError("line1\nline2\n\nline4"), "ValueError: line1"),
    (RuntimeError("(sqlite3.OperationalError) database is locked\n[SQL: SELECT 1]\n"
                  "(Background on this error at: https://sqlalche.me/e/21/e3q8)"),
     "RuntimeError: (sqlite3.OperationalError) database is locked"),
    (RuntimeError('Traceback (most recent call last):\n  File "w.py", line 1\nKeyError: 3'),
     "RuntimeError: KeyError: 3"),
    (ValueError(), "ValueError"),
    (ValueError("E" * 5000), "ValueError: " + "E" * 985 + "..."),
])
def test_the_error_line_is_the_cause_in_one_short_line(exc: BaseException, line: str) -> None:
    """hpo.error, shown by status and the progress lines: it kept a message's last line
    (SQLAlchemy's 'Background on this error' link instead of the cause) and all of it (a
    5 MB message printed three times)."""
    from hpo_orchestrator.worker._child import last_line

    assert last_line(exc) == line


def test_classify_without_last_words() -> None:
    asked: list[str] = []

    def tail() -> str:
        asked.append("tail")
        return ""

    assert classify(stop_reason=None, outcome=None, returncode=1, timeout_s=None,
                    oom_killed=lambda: False, log_tail=tail).error == "exited with code 1: no result"
    assert classify(stop_reason=None, outcome=TrialOutcome(kind="value", value=1.0), returncode=0,
                    timeout_s=None, oom_killed=lambda: False, log_tail=tail).state == TrialState.COMPLETE
    assert asked == ["tail"]  # the log is read only for a child that died without a result


@pytest.mark.parametrize(("reason", "attempt", "max_retries", "expected"), [
    ("oom", 1, 1, True), ("killed", 1, 1, True), ("lost", 2, 1, False), ("lost", 2, 2, True),
    ("exception", 1, 5, False), ("timeout", 1, 5, False), ("interrupted", 1, 5, False),
    (None, 1, 1, False), ("oom", 1, 0, False),
])
def test_retry_allowed(reason: str | None, attempt: int, max_retries: int, expected: bool) -> None:
    assert retry_allowed(reason, attempt, max_retries) is expected


@pytest.mark.parametrize(("reason", "attempt", "max_retries", "expected"), [
    ("oom", 1, 1, 2), ("lost", 2, 1, None), ("exception", 1, 5, None),
    ("interrupted", 1, 0, 1), ("interrupted", 3, 1, 3),  # always again, no attempt used up
])
def test_retry_attempt(reason: str, attempt: int, max_retries: int, expected: int | None) -> None:
    assert retry_attempt(reason, attempt, max_retries) == expected


def _keep(**change: object) -> bool:
    facts: dict[str, object] = {"reuse": True, "alive": True, "connection_open": True,
                                "stopping": False, "state": TrialState.COMPLETE, "trials_run": 3,
                                "max_trials": 100, **change}
    return keep_worker(**facts)  # type: ignore[arg-type]


def test_keep_worker() -> None:
    assert _keep() and _keep(state=TrialState.PRUNED)
    assert not _keep(reuse=False)
    assert not _keep(alive=False)
    assert not _keep(connection_open=False)
    assert not _keep(stopping=True)
    assert not _keep(state=TrialState.FAIL)
    assert not _keep(trials_run=100)


def test_child_env_round_trips() -> None:
    env = ChildEnv(trial_number=7, attempt=2, slot=3, gpu_index=1, gpu_uuid="GPU-abc",
                   cuda_visible_devices="GPU-abc", num_threads=4)
    rendered = env.render()
    assert rendered["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert rendered["OMP_NUM_THREADS"] == rendered["MKL_NUM_THREADS"] == "4"
    assert ChildEnv.parse(rendered) == env


def test_child_env_of_a_cpu_slot_and_outside_a_child() -> None:
    cpu = ChildEnv(trial_number=0, attempt=1, slot=0, gpu_index=None, gpu_uuid=None,
                   cuda_visible_devices="", num_threads=2)
    assert ChildEnv.parse(cpu.render()) == cpu
    assert ChildEnv.parse({}) == ChildEnv(trial_number=None, attempt=1, slot=None, gpu_index=None,
                                          gpu_uuid=None, cuda_visible_devices=None,
                                          num_threads=None)


def test_begin_trial_moves_a_reused_process_to_its_next_trial() -> None:
    environ = ChildEnv(trial_number=0, attempt=1, slot=0, gpu_index=None, gpu_uuid=None,
                       cuda_visible_devices="", num_threads=1).render()
    begin_trial(5, 2, environ=environ)
    parsed = ChildEnv.parse(environ)
    assert (parsed.trial_number, parsed.attempt, parsed.slot) == (5, 2, 0)


def test_an_interrupted_trial_says_who_stopped_it() -> None:
    """The failure policy's stop is recorded as the policy's, not as a signal (issue 15)."""
    verdict = classify(stop_reason="interrupted", outcome=None, returncode=-15, timeout_s=None,
                       oom_killed=lambda: False, log_tail=lambda: "",
                       stop_error="stopped by study.fail_fast: the first 2 trials ...")
    assert verdict == Verdict(TrialState.FAIL, None, "interrupted",
                              "stopped by study.fail_fast: the first 2 trials ...")


def test_begin_trial_gives_a_reused_process_its_trials_threads() -> None:
    """trials_per_gpu=auto re-divides the cores as levels change: a reused worker born with 16
    threads runs its next trial with the 8 its Job says (the objectives read slot_info())."""
    environ = ChildEnv(trial_number=0, attempt=1, slot=0, gpu_index=0, gpu_uuid="GPU-0",
                       cuda_visible_devices="GPU-0", num_threads=16).render()
    begin_trial(1, 1, num_threads=8, environ=environ)
    assert ChildEnv.parse(environ).num_threads == 8 and environ["OMP_NUM_THREADS"] == "8"
    begin_trial(2, 1, environ=environ)  # no threads in the Job (CPU slots): kept
    assert ChildEnv.parse(environ).num_threads == 8


def test_a_child_that_died_of_an_uncaught_keyboard_interrupt_was_killed() -> None:
    """A SIGINT that reached a child before its handler (still importing) ends it with exit 1
    and Python's "KeyboardInterrupt" line: killed from outside (retried), not the objective's
    exception, which the child would have reported (CI: test_signals failed on this race)."""
    verdict = classify(stop_reason=None, outcome=None, returncode=1, timeout_s=None,
                       oom_killed=lambda: False, log_tail=lambda: "KeyboardInterrupt")
    assert (verdict.state, verdict.fail_reason) == (TrialState.FAIL, "killed")
    other = classify(stop_reason=None, outcome=None, returncode=1, timeout_s=None,
                     oom_killed=lambda: False, log_tail=lambda: "ValueError: bad")
    assert (other.fail_reason, other.error) == ("exception", "exited with code 1: ValueError: bad")
