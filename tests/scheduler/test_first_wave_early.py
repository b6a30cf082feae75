"""The first wave starts before the storage (scheduler/_first_wave.py): the run's first workers
start up while the orchestrator imports Optuna, opens the storage and creates the study. A run
that stops before its loop leaves no worker running and no folder made for them; a budget
smaller than the wave retires the workers it has no trial for, and a run of fewer trials than
slots starts no more workers than trials."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import psutil
import pytest

from hpo_orchestrator import run_study
from hpo_orchestrator.config import load_config
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import NoGpuBackend
from hpo_orchestrator.scheduler import FirstWave
from tests.conftest import trial_rows

pytestmark = pytest.mark.slow  # real worker processes

OBJECTIVES = "tests.objectives"


def _config(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_config([
        "objective=custom", f"objective.target={OBJECTIVES}:quadratic", "pruner=none",
        "scheduler.parallel=2", "scheduler.gpus=none", f"scheduler.lease_dir={tmp_path / 'leases'}",
        f"storage.url=sqlite:///{tmp_path / 'hpo.db'}", "telemetry.enabled=false", *extra])


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_the_workers_start_up_before_the_storage_exists_and_close_leaves_nothing(
        tmp_path: Path) -> None:
    wave = FirstWave(_config(tmp_path), backend=NoGpuBackend("no GPU in this test"))
    wave.start()
    workers = list(wave.workers.idle.values())
    pids = [w.process.pid for w in workers]
    try:
        assert len(workers) == 2 and all(w.process.poll() is None for w in workers)
        until = time.monotonic() + 30
        while wave.workers.starting() and time.monotonic() < until:
            time.sleep(0.05)
        assert not wave.workers.starting()  # both said ready: started up with no storage
        assert not (tmp_path / "hpo.db").exists()
        assert (tmp_path / "hpo-runs" / "hpo").is_dir()  # their start-up output goes there
    finally:
        wave.close()
    assert _gone(pids), pids
    assert not (tmp_path / "hpo-runs").exists()  # made for the workers, empty again: removed
    wave.close()  # twice: nothing left to do


def test_a_run_refused_after_its_workers_started_leaves_no_worker_and_no_folder(
        tmp_path: Path) -> None:
    """The study exists with the other direction: ConfigError (exit 2), raised after the first
    wave started (the storage is read after it); the workers go, and their folder with them."""
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="hpo",
                        direction="maximize")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ConfigError, match="already exists with direction maximize"):
        run_study(_config(tmp_path), backend=NoGpuBackend("no GPU in this test"))
    started = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert _gone(started), started
    # the study's run folder is gone; hpo-runs/ keeps the storage's lock file, as before
    assert not (tmp_path / "hpo-runs" / "hpo").exists()


def test_a_budget_smaller_than_the_wave_retires_the_workers_it_has_no_trial_for(
        tmp_path: Path) -> None:
    """parallel=2 starts two workers before the budget is known; the study of 3 trials has 2
    done, one left: one worker runs it, the other is retired before the loop (its start-up
    log goes with it), and the run ends as before."""
    backend = NoGpuBackend("no GPU in this test")
    siblings = f"objective.target={OBJECTIVES}:siblings"
    assert run_study(_config(tmp_path, "study.n_trials=2", siblings), backend=backend).exit_code == 0
    result = run_study(_config(tmp_path, "study.n_trials=3", siblings), backend=backend)
    assert result.exit_code == 0
    rows = trial_rows(tmp_path / "hpo.db")
    assert [r["state"] for r in rows] == ["COMPLETE"] * 3
    # the first run's two trials ran beside each other's worker; the last alone: the other
    # worker of its wave was gone before it was asked, not idle until the run's end
    assert [r["attrs"]["test.siblings"] for r in rows][2] == 0
    assert max(r["attrs"]["test.siblings"] for r in rows[:2]) == 1
    run_folder = tmp_path / "hpo-runs" / "hpo"
    assert not list(run_folder.glob("spare-slot*.log"))
    assert (run_folder / "trial-2.log").exists() or list(run_folder.glob("trial-2*"))


@pytest.mark.parametrize("trials", ["study.n_trials=1", "study.add_trials=1"])
def test_a_run_of_fewer_trials_than_slots_starts_no_worker_it_has_no_trial_for(
        tmp_path: Path, trials: str) -> None:
    """The budget, read from the storage after the wave started, is at most study.n_trials
    (or add_trials): a worker beyond it would only start up (0.2 s of CPU on the 2-core
    machine, beside the orchestrator's own start-up) to be retired."""
    wave = FirstWave(_config(tmp_path, trials), backend=NoGpuBackend("no GPU in this test"))
    try:
        wave.start()
        assert wave.layout.slots.concurrency == 2
        assert len(wave.workers.idle) == 1
    finally:
        wave.close()


def test_show_config_starts_no_worker(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "--show-config")
    assert result.code == 0, result.stderr
    assert not (tmp_path / "hpo-runs").exists()


@pytest.mark.parametrize(("per_gpu", "held"), [
    ("2", [(0, 0), (0, 1)]), ("2", [(1, 0)]), ("1", [(1, 0)]),
    ("auto", [(0, k) for k in range(4)])])  # auto: up to 4 slots a GPU (max_trials_per_gpu)
def test_a_wave_short_of_slots_at_its_start_is_topped_up_on_slots_that_came_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_gpu: str,
        held: list[tuple[int, int]]) -> None:
    """Another orchestrator holds some GPU slots while the early wave starts, and lets them go
    before the loop: the loop starts the rest of the wave there, never a second worker on a
    slot whose early worker waits, and the run ends with no slot, lease or process left."""
    from hpo_orchestrator.gpu import open_backend
    from hpo_orchestrator.placement import LeaseDir
    from hpo_orchestrator.scheduler._workers import Workers

    monkeypatch.setenv("HPO_ORCHESTRATOR_FAKE_GPUS", "2")
    # only this test's processes count on its fake GPUs (another case's last workers would
    # read as someone else's work there: gpu/_fake.py)
    monkeypatch.setenv("HPO_FAKE_GPU_MACHINE", f"topup-{tmp_path.name}")
    backend = open_backend()
    uuids = [g.uuid for g in backend.gpus()]
    backend.close()
    leases = tmp_path / "leases"
    others = [LeaseDir(leases).try_acquire(uuids[g], k) for g, k in held]
    assert all(others)
    config = load_config([
        "objective=custom", f"objective.target={OBJECTIVES}:quadratic", "study.n_trials=6",
        f"scheduler.trials_per_gpu={per_gpu}", "scheduler.cpu_slots=1",
        f"scheduler.lease_dir={leases}", f"storage.url=sqlite:///{tmp_path / 'hpo.db'}",
        "telemetry.enabled=false"])
    started: list[int] = []
    prepared = Workers._prepared

    def spy(self, slot, threads, objective, announce):  # type: ignore[no-untyped-def]
        assert slot.id not in self.idle, f"a second worker on slot {slot.id}"
        started.append(slot.id)
        return prepared(self, slot, threads, objective, announce)

    monkeypatch.setattr(Workers, "_prepared", spy)
    wave = FirstWave(config)
    wave.start()
    early = len(wave.workers.idle)
    assert early < wave.layout.slots.concurrency  # short of slots: the others held some
    for lease in others:
        assert lease is not None
        lease.release()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert run_study(config, first_wave=wave).exit_code == 0
    assert len(started) >= wave.layout.slots.concurrency  # topped up to the whole wave
    assert not wave.workers.idle and wave.layout.slots.busy == 0
    assert all(not LeaseDir(leases).holders(u) for u in uuids)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
