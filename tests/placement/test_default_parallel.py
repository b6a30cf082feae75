"""With scheduler.parallel unset, a run uses every GPU it was given, one trial each to start
(more where a GPU has room: tests/placement/test_rules_first_level.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, trial_rows


@pytest.mark.slow
def test_a_custom_objective_runs_on_every_gpu_without_a_parallel_setting(tmp_path: Path) -> None:
    """The README's custom-objective command names no scheduler.parallel: on 4 GPUs, 4 trials
    start at once, one per GPU (at the old default of 1 every trial ran on gpu0)."""
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.objectives:curves",
                     "study.n_trials=8", env={"HPO_ORCHESTRATOR_FAKE_GPUS": "4"})
    assert result.code == 0, result.stderr
    assert "4 trials at a time (1 per GPU to start, more while throughput rises; " \
        "scheduler.parallel unset)" in " ".join(result.stdout.split())  # the line may wrap
    gpus = {row["attrs"]["hpo.gpu_index"] for row in trial_rows(result.db)}
    assert gpus == {0, 1, 2, 3}


@pytest.mark.slow
def test_without_gpus_one_trial_per_core(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.objectives:curves",
                     "study.n_trials=3", "scheduler.host_cores=3", "scheduler.gpus=none")
    assert result.code == 0, result.stderr
    assert "3 CPU slots (one trial per core of 3, scheduler.parallel unset), 1 CPU thread " \
        "each" in result.stdout
    assert [r["attrs"]["hpo.num_threads"] for r in trial_rows(result.db)] == [1, 1, 1]


@pytest.mark.slow
def test_cpu_slots_run_trials_beside_the_gpus(tmp_path: Path) -> None:
    """scheduler.cpu_slots=2 on 2 GPUs: four at once, two of them on CPU slots (an empty
    CUDA_VISIBLE_DEVICES, no GPU index), the cores shared by all four (issue 27.3). (The
    start-up overlap off: while it may open a place on a starting GPU, that place counts in
    the share, tests/placement/test_rules_startup.py.)"""
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.objectives:curves",
                     "study.n_trials=12", "scheduler.cpu_slots=2", "scheduler.host_cores=8",
                     "scheduler.startup_overlap=false",
                     env={"HPO_ORCHESTRATOR_FAKE_GPUS": "2", "HPO_TEST_STEP_S": "0.1"})
    assert result.code == 0, result.stderr
    assert "4 trials at a time (1 per GPU to start, more while throughput rises and 2 on " \
        "CPU slots" in result.stdout
    rows = trial_rows(result.db)
    on_cpu = [r for r in rows if r["attrs"]["hpo.gpu_index"] is None]
    assert on_cpu and all(r["attrs"]["hpo.cuda_visible_devices"] == "" for r in on_cpu)
    assert {r["attrs"]["hpo.gpu_index"] for r in rows} == {0, 1, None}
    assert {r["attrs"]["hpo.num_threads"] for r in rows} == {2}


def test_cpu_slots_refuse_a_forced_gpu_learner(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "scheduler.cpu_slots=1", "objective.device=gpu",
                     env={"HPO_ORCHESTRATOR_FAKE_GPUS": "1"})
    assert result.code == 2 and result.stderr.startswith("error: scheduler.cpu_slots=1 with "
                                                         "objective.device=gpu")
    assert not (tmp_path / "hpo.db").exists()
