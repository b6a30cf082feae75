"""``run_study`` in-process: the library entry point runs a tiny CPU study without the CLI."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator import run_study
from hpo_orchestrator.config import load_config
from hpo_orchestrator.gpu import NoGpuBackend
from hpo_orchestrator.runner import PreparedRun
from hpo_orchestrator.scheduler import FinishedTrial, RunningTrial
from tests.conftest import trial_rows

pytestmark = pytest.mark.slow  # trials run in real child processes


def test_run_study_runs_a_cpu_study_in_process(tmp_path: Path) -> None:
    db = tmp_path / "hpo.db"
    config = load_config([
        "objective=custom", "objective.target=hpo_orchestrator.testing.objectives:quadratic",
        "pruner=none", "study.n_trials=4", "scheduler.parallel=2", "scheduler.gpus=none",
        f"scheduler.lease_dir={tmp_path / 'leases'}", f"storage.url=sqlite:///{db}",
        "telemetry.enabled=false"])
    prepared: list[PreparedRun] = []
    done: list[FinishedTrial] = []

    class Reporter:
        def started(self, rt: RunningTrial) -> None:
            pass

        def finished(self, trial: FinishedTrial) -> None:
            done.append(trial)

        def tick(self, running: list[RunningTrial]) -> None:
            pass

    def progress(run: PreparedRun) -> nullcontext[Reporter]:
        prepared.append(run)
        return nullcontext(Reporter())

    result = run_study(config, backend=NoGpuBackend("no GPU in this test"), progress=progress)

    assert result.exit_code == 0 and not result.interrupted and result.study_name == "hpo"
    assert [(p.gpus, p.concurrency, p.already_claimed) for p in prepared] == [([], 2, 0)]
    assert sorted(t.number for t in done) == [0, 1, 2, 3]
    rows = trial_rows(db)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 4
    assert all(r["attrs"]["hpo.gpu_index"] is None for r in rows)
    study = optuna.load_study(study_name="hpo", storage=f"sqlite:///{db}")
    assert study.best_value < 2.25  # (x - 0.5)^2 over x in [-2, 2]
