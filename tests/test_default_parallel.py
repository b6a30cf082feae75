"""With scheduler.parallel unset, a run uses every GPU it was given (issue 27.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, trial_rows


@pytest.mark.slow
def test_a_custom_objective_runs_on_every_gpu_without_a_parallel_setting(tmp_path: Path) -> None:
    """The README's custom-objective command names no scheduler.parallel: on 4 GPUs, 4 trials
    run at once, one per GPU (at the old default of 1 every trial ran on gpu0)."""
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=hpo_orchestrator.testing.objectives:curves",
                     "study.n_trials=8", env={"HPO_ORCHESTRATOR_FAKE_GPUS": "4"})
    assert result.code == 0, result.stderr
    assert "4 trials at a time (one trial per GPU given, scheduler.parallel unset)" in result.stdout
    gpus = {row["attrs"]["hpo.gpu_index"] for row in trial_rows(result.db)}
    assert gpus == {0, 1, 2, 3}


@pytest.mark.slow
def test_without_gpus_one_trial_per_core(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=hpo_orchestrator.testing.objectives:curves",
                     "study.n_trials=3", "scheduler.host_cores=3", "scheduler.gpus=none")
    assert result.code == 0, result.stderr
    assert "3 CPU slots (one trial per core of 3, scheduler.parallel unset), 1 CPU threads " \
        "each" in result.stdout
    assert [r["attrs"]["hpo.num_threads"] for r in trial_rows(result.db)] == [1, 1, 1]
