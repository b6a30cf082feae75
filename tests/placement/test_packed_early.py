"""Packed from the first seconds (issue 51.1): on a host of few cores, GPUs a quarter busy
with trials that use little CPU get more trials each while their first trials still run.

Before, the room for one more trial was counted from the trials at once (one per core) and
from the threads given to the running trials: on 2 cores with 2 GPUs the default never
packed ("no CPU core for 1 more trial") although the trials used almost none of them. The
room is now the host CPU the running trials were measured to use (placement/_rules.py
``cpu_room``, tests/placement/test_rules_cpu_room.py).

And from the first trial's start-up (issue 51.1, "Packed from the first seconds"): the CNN of
workload (c) left an H200 idle for the first 12-13 s of its first trial (imports, data, CUDA
context), then took 2.3 s for its ten epochs, so the first level came at its end. While no
trial on a GPU has reported a step and the GPU reads idle, it takes one more
(``scheduler.startup_overlap``; the rule's own tests: tests/placement/test_rules_startup.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, trial_rows


@pytest.mark.slow
def test_two_cores_two_gpus_a_quarter_busy_pack_before_the_first_trials_end(tmp_path: Path) -> None:
    """Done-when of issue 51.1: 2 cores, 2 fake GPUs 25 % busy while trials that sleep run on
    them, scheduler.parallel unset: a second trial starts on a GPU while that GPU's first
    trial still runs (the first level is chosen from the first reported steps, not at the
    first trial's end)."""
    gpus = {"gpus": [{"busy_util": 25}, {"busy_util": 25}]}
    result = run_cli(tmp_path, "run", "objective=custom", "objective.target=tests.objectives:low_cpu",
                     "study.n_trials=8", "scheduler.host_cores=2", "telemetry.interval_s=0.2",
                     "pruner=none", env={"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps(gpus)})
    assert result.code == 0, result.stderr
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for row in trial_rows(result.db):
        attrs = row["attrs"]
        by_gpu.setdefault(attrs["hpo.gpu_index"], []).append((attrs["test.t0"], attrs["test.t1"]))
    early = {}
    for gpu, spans in by_gpu.items():
        first_start, first_end = min(spans)
        early[gpu] = [start for start, _ in spans if first_start < start < first_end]
    assert any(early.values()), (early, result.stdout)
    assert "no CPU core" not in result.stdout


def _started_before_the_first_step(tmp_path: Path, *overrides: str) -> tuple[list[float], str]:
    """One fake GPU, idle until a trial works it; each worker's first trial starts up for 6 s
    without touching it; 4 cores, whatever the test machine has. The starts of trials on the
    GPU before its first trial's first step (the trials' own clocks), and what the run said."""
    work = tmp_path / "gpu-work"
    work.mkdir()
    result = run_cli(tmp_path, "run", "objective=custom", "objective.target=tests.objectives:slow_start",
                     "study.n_trials=4", "telemetry.interval_s=0.2", "pruner=none",
                     "scheduler.host_cores=4", *overrides,
                     env={"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps({"gpus": [{"busy_util": 30}]}),
                          "HPO_FAKE_GPU_WORK_DIR": str(work)})
    assert result.code == 0, result.stderr
    attrs = [row["attrs"] for row in trial_rows(result.db)]
    first = min(attrs, key=lambda a: a["test.t0"])
    return [a["test.t0"] for a in attrs if a is not first and a["test.t0"] < first["test.first_step"]], \
        result.stdout


@pytest.mark.slow
def test_a_second_trial_starts_while_the_first_is_still_starting_up(tmp_path: Path) -> None:
    early, said = _started_before_the_first_step(tmp_path, "scheduler.startup_overlap=true")
    assert early, said
    assert "1 -> 2 trials per GPU (started during the first trial's start-up (GPU idle" in said


@pytest.mark.slow
def test_by_default_the_first_trial_starts_up_alone(tmp_path: Path) -> None:
    early, said = _started_before_the_first_step(tmp_path)
    assert early == [], said
    assert "started during the first trial's start-up" not in said


@pytest.mark.slow
def test_two_start_up_trials_that_keep_the_gpu_busy_stay_two(tmp_path: Path) -> None:
    """On an H200 (workload c) the two trials of the start-up read 81-96 % once both were
    past it; the rule went back to one trial and the GPU idled at 20-40 % until it climbed
    again. Two trials sharing a GPU's time lose nothing against one: the level stays."""
    work = tmp_path / "gpu-work"
    work.mkdir()
    result = run_cli(tmp_path, "run", "objective=custom", "objective.target=tests.objectives:slow_start",
                     "study.n_trials=6", "telemetry.interval_s=0.2", "pruner=none",
                     "scheduler.host_cores=4", "scheduler.startup_overlap=true",
                     env={"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps({"gpus": [{"busy_util": 90}]}),
                          "HPO_FAKE_GPU_WORK_DIR": str(work), "HPO_TEST_STARTUP_S": "3"})
    assert result.code == 0, result.stderr
    said = result.stdout
    assert "1 -> 2 trials per GPU (started during the first trial's start-up" in said, said
    assert "2 -> 1 trials per GPU" not in said and "gpu0 1 -> 2, now 2" in said, said
