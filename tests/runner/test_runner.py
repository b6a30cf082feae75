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
        "objective=custom", "objective.target=tests.objectives:quadratic",
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

        def note(self, text: str) -> None:
            pass

        def setting_up(self, workers: int, elapsed_s: float) -> None:
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


def test_a_signal_during_a_launch_stops_that_trial_too(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM handled while a trial is being spawned (Slurm's scancel signals the children
    and the orchestrator at once: a child's death starts the next trial, and the signal came
    before that trial was among the running ones). The late trial is stopped with the others
    (FAIL, interrupted), not left to run its 60 s, and not left RUNNING when the job is
    killed after Slurm's KillWait (CI saw one RUNNING in test_cluster's scancel test)."""
    import signal

    from hpo_orchestrator.scheduler.orchestrator import Orchestrator

    spawns: list[int] = []
    spawn = Orchestrator._spawn

    def spawn_with_a_signal(self: Orchestrator, asked: object, slot: object) -> None:
        spawns.append(1)
        if len(spawns) == 3:  # the third trial: two are running
            self._on_signal(signal.SIGTERM, None)
        spawn(self, asked, slot)  # type: ignore[arg-type]

    monkeypatch.setattr(Orchestrator, "_spawn", spawn_with_a_signal)
    monkeypatch.setenv("HPO_TEST_SLEEP_S", "60")
    db = tmp_path / "hpo.db"
    config = load_config([
        "objective=custom", "objective.target=tests.objectives:sleepy",
        "pruner=none", "study.n_trials=4", "scheduler.parallel=3", "scheduler.gpus=none",
        "scheduler.kill_grace_s=1", f"scheduler.lease_dir={tmp_path / 'leases'}",
        f"storage.url=sqlite:///{db}", "telemetry.enabled=false"])
    result = run_study(config, backend=NoGpuBackend("no GPU in this test"))
    assert result.exit_code == 130 and len(spawns) == 3
    rows = trial_rows(db)
    started = [r for r in rows if "hpo.pid" in r["attrs"]]
    assert len(started) == 3
    assert all(r["state"] == "FAIL" and r["attrs"]["hpo.fail_reason"] == "interrupted"
               for r in started), [(r["number"], r["state"]) for r in started]
