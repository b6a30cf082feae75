"""A run whose own files or stdout fail (not the storage, not a trial): the CLI says which file
failed, the running trials are left for the next run to recover (not recorded as interrupted
by a signal), and the same command then finishes the study (issue 15)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli, start_cli, trial_rows

TARGET = "objective.target=tests.objectives:sleepy"


def _finish_with_a_rerun(tmp_path: Path, args: tuple[str, ...], n_trials: int) -> None:
    rerun = run_cli(tmp_path, *args, env={"HPO_TEST_SLEEP_S": "0.1"})
    assert rerun.code == 0, rerun.stderr
    rows = trial_rows(tmp_path / "hpo.db")
    assert [r["state"] for r in rows].count("COMPLETE") == n_trials
    assert not [r for r in rows if r["state"] in ("RUNNING", "WAITING")]


@pytest.mark.slow
def test_run_piped_into_head_stops_quietly_and_leaves_its_trials(tmp_path: Path) -> None:
    """`hpo-orchestrator run | head`: exit 141 (128 + SIGPIPE, like other CLIs), nothing on
    stderr, and no trial recorded as interrupted (rich's default was SystemExit(1), and the
    running trials were failed 'interrupted: stopped by SIGINT/SIGTERM')."""
    args = ("run", "objective=custom", TARGET, "scheduler.parallel=2", "study.n_trials=4")
    proc = start_cli(tmp_path, *args, env={"HPO_TEST_SLEEP_S": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("trial logs:"):
            break  # what `head -3` reads; the first trial's end is the next line written
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, "")
    rows = trial_rows(tmp_path / "hpo.db")
    assert "RUNNING" in [r["state"] for r in rows]
    assert not [r for r in rows if r["attrs"].get("hpo.fail_reason") == "interrupted"]
    _finish_with_a_rerun(tmp_path, args, 4)


@pytest.mark.slow
def test_a_run_folder_deleted_mid_run_is_named(tmp_path: Path) -> None:
    """The next trial's log cannot be opened: one error line naming it, exit 1; the trial is
    not failed for it (it was told FAIL with no reason) and the rerun finishes the study."""
    args = ("run", "objective=custom", TARGET, "scheduler.parallel=1", "study.n_trials=3",
            "scheduler.worker_mode=fresh")
    proc = start_cli(tmp_path, *args, env={"HPO_TEST_SLEEP_S": "2"})
    first_log = tmp_path / "hpo-runs" / "hpo" / "trial-0.log"
    deadline = time.monotonic() + 120
    while not first_log.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(first_log.parent)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert lines[0] == f"error: {first_log.parent / 'trial-1.log'}: No such file or directory", err
    assert lines[1].startswith("hint: check that the folder exists") and len(lines) == 2
    rows = trial_rows(tmp_path / "hpo.db")
    assert not [r for r in rows if r["state"] == "FAIL"]
    _finish_with_a_rerun(tmp_path, args, 3)
