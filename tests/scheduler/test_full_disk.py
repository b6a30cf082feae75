"""A full disk is not the objective's fault: a trial whose write the file system refused for
want of space (its log in the run folder, or a file of its own) fails as ``disk_full``, runs
again under the same attempt, and the run stops with exit 1 and a hint; the same command
resumes once there is room. Nothing is left behind in the run folder.

The whole-run test mounts a small tmpfs: it needs root (CI runs as root and requires it,
HPO_TEST_REQUIRE_ROOT=1; elsewhere it is skipped with that reason).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from optuna.trial import TrialState

from hpo_orchestrator.scheduler._channel import _well_formed_outcome
from hpo_orchestrator.scheduler._failures import FailurePolicy, disk_full
from hpo_orchestrator.scheduler._outcome import classify, retry_attempt
from hpo_orchestrator.scheduler._tree import ProcessTrees
from hpo_orchestrator.worker import TrialOutcome
from hpo_orchestrator.worker._child import _failure, is_disk_full
from tests.conftest import mounted, remount, run_cli, trial_rows


def _raised(exc: BaseException) -> BaseException:
    """``exc`` as an objective raised it (with its traceback, for ``_failure``)."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def _wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as cause:
            raise outer from cause
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(("exc", "full"), [
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (_wrapped(OSError(errno.ENOSPC, "No space left on device"), RuntimeError("save failed")), True),
    (RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed "
                  "writing file data/0: file write failed: No space left on device"), True),
    (OSError(errno.EACCES, "Permission denied"), False),
    (OSError(errno.EIO, "Input/output error"), False),
    (ValueError("x must be positive"), False),
    (_wrapped(ValueError("bad"), RuntimeError("wrapped")), False),
])
def test_a_refused_write_for_want_of_space_is_told_apart(exc: BaseException, full: bool) -> None:
    assert is_disk_full(exc) is full
    outcome = _failure(_raised(exc))
    assert outcome.fail_reason == ("disk_full" if full else "exception")


def test_a_full_disk_crosses_the_pipe_and_is_the_trials_verdict() -> None:
    outcome = TrialOutcome(kind="error", fail_reason="disk_full",
                           error="OSError: [Errno 28] No space left on device")
    assert _well_formed_outcome(outcome)
    verdict = classify(stop_reason=None, outcome=outcome, returncode=None, timeout_s=None,
                       oom_killed=lambda: False, log_tail=lambda: "")
    assert (verdict.state, verdict.fail_reason) == (TrialState.FAIL, "disk_full")
    assert not _well_formed_outcome(TrialOutcome(kind="error", fail_reason="disk"))


def test_a_full_disk_reruns_the_params_without_using_up_an_attempt() -> None:
    assert retry_attempt("disk_full", attempt=1, max_retries=0) == 1
    assert retry_attempt("disk_full", attempt=3, max_retries=1) == 3
    assert retry_attempt("exception", attempt=1, max_retries=1) is None


def test_the_full_disk_halt_names_the_trial_the_folder_and_the_way_back(tmp_path: Path) -> None:
    halt = disk_full(6, "OSError: [Errno 28] No space left on device", tmp_path)
    assert halt.message == ("no space left on a disk that trial 6 writes to: "
                            "OSError: [Errno 28] No space left on device")
    assert str(tmp_path) in halt.hint and "MiB free" in halt.hint
    assert "run the same command again" in halt.hint
    # a retried trial is not the objective's failure: fail_fast never counts it
    policy = FailurePolicy(fail_fast=1, max_failures=0)
    assert policy.observe(6, True, "disk_full", halt.message, retried=True) is None


def test_a_process_record_that_cannot_be_written_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trees = ProcessTrees(tmp_path)
    trees._record(__import__("os").getpid(), 0)

    def full(self: Path, *args: object, **kwargs: object) -> int:
        with open(self, "w"):  # created, as open() does, before the write is refused
            pass
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    trees._save()
    assert list(tmp_path.iterdir()) == []


_NOISY = '''
import sys


def objective(trial):
    x = trial.suggest_float("x", -10, 10)
    sys.stdout.write("log line " * 6000 + "\\n")  # about 54 kB into the trial's log
    sys.stdout.flush()
    return (x - 2) ** 2
'''


@pytest.mark.slow
def test_a_full_run_folder_stops_the_run_and_the_same_command_resumes(tmp_path: Path) -> None:
    """The trial logs on a 300 KiB tmpfs, five trials' worth: the first trial refused a
    write ends ``disk_full`` (re-run, not the objective's failure), the run stops with exit
    1 and a hint naming the folder, nothing stays RUNNING or half-written; with room, the
    same command finishes the budget, each trial counted once."""
    (tmp_path / "noisy.py").write_text(_NOISY)
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=300k", "tmpfs",
                 what="a 300 KiB tmpfs") as small:
        args = ("run", "objective=custom", "objective.target=noisy:objective",
                "scheduler.parallel=2", "study.n_trials=8", "pruner=none",
                f"scheduler.log_dir={small}")
        first = run_cli(tmp_path, *args)
        assert first.code == 1, first.stdout + first.stderr
        assert "error: no space left on a disk that trial " in first.stderr
        assert f"hint: free space on the file system of the trial logs ({small / 'hpo'}" \
            in first.stderr
        assert "Traceback" not in first.stderr
        assert "finished 8 of 8" not in first.stdout
        rows = trial_rows(first.db)
        full = [r for r in rows if r["attrs"].get("hpo.fail_reason") == "disk_full"]
        assert len(full) == 1 and full[0]["attrs"]["hpo.retried"] is True
        assert not [r for r in rows if r["attrs"].get("hpo.fail_reason") == "exception"]
        assert not [r for r in rows if r["state"] == "RUNNING"]
        assert not list((small / "hpo").glob("processes-*"))

        remount(small, "size=4m")
        again = run_cli(tmp_path, *args)
        assert again.code == 0, again.stdout + again.stderr
        assert "finished 8 of 8" in again.stdout
        rows = trial_rows(again.db)
        counted = [r for r in rows if not r["attrs"].get("hpo.retried")]
        assert [r["state"] for r in counted] == ["COMPLETE"] * 8
        assert not list((small / "hpo").glob("processes-*"))
