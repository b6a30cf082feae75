"""``hpo-orchestrator submit``: bad input refused before sbatch; real jobs on the local Slurm.

The Slurm tests need the one-node cluster of scripts/slurm_local.sh (4 fake GPU device files
as GRES, so Slurm sets each job's CUDA_VISIBLE_DEVICES) and the PostgreSQL test server. They
skip with the reason elsewhere, and fail in CI (.ci/run sets HPO_TEST_REQUIRE_SLURM=1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from hpo_orchestrator.testing.fake_gpu import FAKE_MACHINE_ENV

TARGET = "objective.target=tests.objectives:"
PG = "storage.url=postgresql+psycopg://u@db.example/hpo"
# The jobs' fake node: 4 GPUs, apart from other tests' fake-GPU processes on this host.
FAKE_NODE = {"HPO_ORCHESTRATOR_FAKE_GPUS": "4", FAKE_MACHINE_ENV: f"slurm-{uuid.uuid4().hex[:8]}"}


@pytest.mark.parametrize(("args", "message"), [
    (["slurm.nodes=2"], "error: storage.url=sqlite:///hpo.db: 2 nodes cannot share a sqlite file"),
    (["slurm.color=red", PG], "error: unknown configuration key 'slurm.color'"),
    (["slurm.nodes=0", PG], "error: slurm.nodes: expected an integer >= 1, got 0"),
    (["slurm.nodes=two", PG], "error: slurm.nodes:"),
    (["slurm.time=soon", PG], "error: slurm.time: expected minutes or [D-]HH:MM:SS"),
    (["slurm=nope", PG], "error: unknown slurm 'nope'"),
    (["scheduler.parallel=0", PG], "error: scheduler.parallel:"),
    (["study.add_trials=5", PG], "error: study.add_trials: each job would add its N"),
    ([PG], "error: sbatch is not on PATH"),
])
def test_bad_submit_exits_2_and_submits_nothing(cli, tmp_path: Path, args: list[str],  # type: ignore[no-untyped-def]
                                                message: str) -> None:
    result = cli("submit", *args, env={"PATH": _path_without("sbatch")})
    assert result.code == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(message) and lines[1].startswith("hint: ") and len(lines) == 2
    assert not (tmp_path / "slurm-jobs").exists() and not result.db.exists()


def test_dry_run_prints_the_sbatch_script(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("submit", "--dry-run", "slurm.nodes=3", "slurm.gpus_per_node=2", "slurm.partition=gpu",
                 "slurm.time=2:00:00", "slurm.extra=[--qos=high]", PG.replace("u@", "u:s3cret@"),
                 env={"PATH": _path_without("sbatch")})
    assert result.code == 0, result.stderr
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --gpus-per-node=2", "#SBATCH --partition=gpu",
                 "#SBATCH --time=120", "#SBATCH --qos=high", "#SBATCH --nodes=1"):
        assert line in result.stdout.splitlines()
    assert "s3cret" not in result.stdout and not (tmp_path / "slurm-jobs").exists()
    # issue 30: the run each job executes, and the cores scaled with the GPUs (4 per GPU)
    lines = result.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines[1] == "# each job runs on its node: hpo-orchestrator run " \
        "storage.url=postgresql+psycopg://u:***@db.example/hpo scheduler.parallel=2"
    assert "#SBATCH --cpus-per-task=8" in lines
    assert lines[2].startswith("# --time=120 minutes; --cpus-per-task=8 (4 per GPU")


def test_submit_s_cores_follow_the_gpus_per_node() -> None:
    """--cpus-per-task was 4 whatever the node's GPUs: 8 GPUs' trials shared 4 cores."""
    from hpo_orchestrator.cluster.slurm._config import load_slurm_config

    assert load_slurm_config(["slurm.gpus_per_node=8"]).cpus() == 32
    assert load_slurm_config(["slurm.gpus_per_node=0"]).cpus() == 4
    assert load_slurm_config(["slurm.gpus_per_node=8", "slurm.cpus_per_task=6"]).cpus() == 6


# --- against the local Slurm ----------------------------------------------------------------

@pytest.fixture(scope="session")
def slurm() -> None:
    reason = _slurm_unavailable()
    if reason:
        if os.environ.get("HPO_TEST_REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.mark.slurm
@pytest.mark.slow
def test_partition_slurm_rejects_is_passed_on(cli, slurm: None, postgres_url: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("submit", "slurm.partition=no-such-partition", f"storage.url={postgres_url}")
    assert result.code == 2
    first, hint = result.stderr.splitlines()
    assert first.startswith("error: sbatch refused the jobs: ") and "partition" in first.lower()
    assert hint.startswith("hint: ")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.postgres
def test_two_jobs_share_one_study_on_disjoint_gpus(cli, slurm: None, postgres_url: str) -> None:  # type: ignore[no-untyped-def]
    study = f"slurm-{uuid.uuid4().hex[:8]}"
    result = cli("submit", "slurm.nodes=2", "slurm.gpus_per_node=2", "slurm.cpus_per_task=1",
                 "slurm.time=10", "objective=custom", TARGET + "slurm_probe", "pruner=none",
                 "study.n_trials=12", f"study.name={study}", f"storage.url={postgres_url}",
                 env={**FAKE_NODE, "HPO_TEST_STEP_S": "0.2"})
    assert result.code == 0, result.stderr
    array = _array_id(result.stdout)
    _wait_until_gone(array, timeout=200)
    rows = _trials(postgres_url, study)
    assert len(rows) == 12 and all(r["state"] == "COMPLETE" for r in rows)
    by_job: dict[str, set[int]] = {}
    for row in rows:
        a = row["attrs"]
        allocation = {int(i) for i in a["test.slurm_job_gpus"].split(",")}
        assert len(allocation) == 2 and a["hpo.gpu_index"] in allocation
        by_job.setdefault(a["test.slurm_array_task_id"], set()).add(a["hpo.gpu_index"])
    assert sorted(by_job) == ["0", "1"]
    assert not by_job["0"] & by_job["1"]
    status = json.loads(cli("status", "--storage", postgres_url, "--study", study, "--json").stdout)
    assert sorted(d["gpu_index"] for d in status["per_device"]) == sorted(by_job["0"] | by_job["1"])


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.postgres
def test_scancel_of_one_job_leaves_no_trial_running(cli, slurm: None, postgres_url: str) -> None:  # type: ignore[no-untyped-def]
    study = f"slurm-{uuid.uuid4().hex[:8]}"
    result = cli("submit", "slurm.nodes=2", "slurm.gpus_per_node=2", "slurm.cpus_per_task=1",
                 "slurm.time=10", "objective=custom", TARGET + "slurm_probe", "pruner=none",
                 "study.n_trials=40", f"study.name={study}", f"storage.url={postgres_url}",
                 env={**FAKE_NODE, "HPO_TEST_STEP_S": "20"})
    assert result.code == 0, result.stderr
    array = _array_id(result.stdout)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both jobs run trials
            running = [r for r in _trials(postgres_url, study) if r["state"] == "RUNNING"]
            if {r["attrs"].get("test.slurm_array_task_id") for r in running} >= {"0", "1"}:
                break
            time.sleep(1)
        else:
            pytest.fail("the two jobs never ran trials at the same time")
        subprocess.run(["scancel", f"{array}_0"], check=True)
        _wait_until_gone(f"{array}_0", timeout=60)
        rows = _trials(postgres_url, study)
        cancelled = [r for r in rows if r["attrs"].get("test.slurm_array_task_id") == "0"]
        assert cancelled and not [r for r in cancelled if r["state"] == "RUNNING"]
        assert all(r["attrs"].get("hpo.fail_reason") in ("interrupted", "killed") for r in cancelled
                   if r["state"] == "FAIL")
        assert any(r["state"] == "RUNNING" for r in rows
                   if r["attrs"].get("test.slurm_array_task_id") == "1")  # the other job goes on
    finally:
        subprocess.run(["scancel", array], check=False)
        _wait_until_gone(array, timeout=60)
    assert not [r for r in _trials(postgres_url, study) if r["state"] == "RUNNING"]


def _slurm_unavailable() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "Slurm is not installed (scripts/slurm_local.sh installs and starts a local one)"
    probe = subprocess.run(["sinfo", "-h", "-o", "%t %G"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or "gpu:4" not in probe.stdout:
        return (f"no local Slurm with gpu:4 GRES answers ({(probe.stderr or probe.stdout).strip()}); "
                "run scripts/slurm_local.sh and export SLURM_CONF")
    return None


def _path_without(program: str) -> str:
    folders = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(f for f in folders if not (Path(f) / program).exists())


def _array_id(stdout: str) -> str:
    line = next(line for line in stdout.splitlines() if line.startswith("submitted "))
    return line.split(": ", 1)[1].split()[0].split("_")[0]


def _wait_until_gone(job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        if queue.returncode != 0 and "Invalid job id" in queue.stderr:
            return
        time.sleep(1)
    pytest.fail(f"Slurm job {job} still queued after {timeout:.0f} s")


def _trials(url: str, study: str) -> list[dict[str, Any]]:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as con:
            trials = con.execute(sqlalchemy.text(
                "SELECT t.trial_id, t.state FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "WHERE s.study_name = :s"), {"s": study}).all()
            rows = []
            for trial_id, state in trials:
                attrs = {k: json.loads(v) for k, v in con.execute(sqlalchemy.text(
                    "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = :t"),
                    {"t": trial_id})}
                rows.append({"state": str(state).split(".")[-1], "attrs": attrs})
    finally:
        engine.dispose()
    return rows
