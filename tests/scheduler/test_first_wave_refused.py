"""A run refused after its first wave started (scheduler/_first_wave.py) leaves behind what a
refused run left before the wave started early, which is nothing of its own: no waiting
marker in the lease folder, no .gitignore or folder it made, no other run's start-up logs;
and an unusable run folder is still a configuration error (exit 2). Found by a review of the
change; each failed on its first version."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpo_orchestrator.gpu import NoGpuBackend
from tests.conftest import cli_env

pytestmark = pytest.mark.slow  # real CLI processes / real workers

BAD_TARGET = ["objective=custom", "objective.target=no_such_module_xyz:objective"]


def test_a_refused_run_leaves_no_waiting_marker_in_the_lease_folder(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Another orchestrator holds the GPU; this run is refused (bad objective) after its
    first wave's acquire() said "waiting" (LeaseDir.wait_for): the marker must go with it
    (left, and in a process that lives on its flock too, the holder would yield its GPU to
    nobody for WAIT_FRESH_S)."""
    from hpo_orchestrator.gpu import open_backend
    from hpo_orchestrator.placement import LeaseDir

    monkeypatch.setenv("HPO_ORCHESTRATOR_FAKE_GPUS", "1")
    backend = open_backend()
    uuid = backend.gpus()[0].uuid
    backend.close()
    leases = tmp_path / "leases"
    held = LeaseDir(leases).try_acquire(uuid, 0)  # "the other orchestrator"
    assert held is not None
    # one slot on the GPU, the one held: the first wave waits for it (packed by default, it
    # would take a second slot and never wait)
    result = cli("run", *BAD_TARGET, f"scheduler.lease_dir={leases}", "scheduler.trials_per_gpu=1",
                 env={"HPO_ORCHESTRATOR_FAKE_GPUS": "1"})
    assert result.code == 2, result.stderr
    assert not list(leases.glob("*.waiting.*")), sorted(p.name for p in leases.iterdir())


def test_a_refused_run_writes_no_gitignore_into_an_existing_log_dir(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """scheduler.log_dir=. (or any existing folder): the run folder's ensure_run_dir writes
    '*' into ./.gitignore, which would hide the user's project from git after a refused run."""
    result = cli("run", *BAD_TARGET, "scheduler.log_dir=.", "scheduler.gpus=none")
    assert result.code == 2, result.stderr
    assert not (tmp_path / ".gitignore").exists(), (tmp_path / ".gitignore").read_text()


def test_a_refused_run_leaves_no_parent_folders_of_a_nested_log_dir(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """log_dir=a/b/c: the run folder's mkdir(parents=True) makes a/ and a/b/ too."""
    result = cli("run", *BAD_TARGET, f"scheduler.log_dir={tmp_path / 'a' / 'b' / 'c'}",
                 "scheduler.gpus=none")
    assert result.code == 2, result.stderr
    assert not (tmp_path / "a").exists(), sorted(str(p) for p in (tmp_path / "a").rglob("*"))


def test_a_run_folder_that_cannot_be_made_is_still_a_config_error(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """hpo-runs is a file: exit 2 "artifacts.store: cannot write to ... is not a folder" (the
    default store is in the run folder), checked before anything is made; not exit 1 naming
    processes-<pid>.json with a hint that "the same command resumes the run"."""
    (tmp_path / "hpo-runs").write_text("")
    result = cli("run", "study.n_trials=1", "scheduler.gpus=none")
    assert result.code == 2, result.stderr
    assert "processes-" not in result.stderr


def test_close_after_a_failed_start_does_not_raise(tmp_path: Path) -> None:
    from hpo_orchestrator.config import load_config
    from hpo_orchestrator.scheduler import FirstWave

    (tmp_path / "hpo-runs").write_text("")
    config = load_config(["objective=custom",
                          "objective.target=tests.objectives:quadratic",
                          "scheduler.parallel=2", "scheduler.gpus=none",
                          f"scheduler.lease_dir={tmp_path / 'leases'}",
                          f"storage.url=sqlite:///{tmp_path / 'hpo.db'}",
                          f"artifacts.store={tmp_path / 'store'}"])
    wave = FirstWave(config, backend=NoGpuBackend("no GPU in this test"))
    with pytest.raises(OSError):  # hpo-runs is a file; a default store elsewhere passed the check
        wave.start()
    wave.close()  # the start's error is the one reported: close() raises nothing over it


def test_a_refused_run_of_the_same_study_keeps_the_running_ones_start_up_logs(
        tmp_path: Path) -> None:
    """Run A (CPU slots) is in its first wave's setup; run B of the same study on this host
    is refused after its own wave started (the study's direction). B retires its workers and
    their start-up logs: its own (spare-slot<N>-<host>-<pid>.log), not A's of the same slot numbers,
    so A's trial logs keep their setup's output."""
    (tmp_path / "noisy.py").write_text(
        "import time\n"
        "def setup():\n    print('SETUP-OUTPUT', flush=True)\n    time.sleep(6)\n"
        "def objective(trial):\n    return trial.suggest_float('x', -1, 1) ** 2\n")
    common = ["objective=custom", "objective.target=noisy:objective",
              "objective.setup=noisy:setup", "study.n_trials=2", "scheduler.parallel=2",
              "scheduler.gpus=none", "storage.url=sqlite:///hpo.db"]
    env = {**cli_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    command = [sys.executable, "-m", "hpo_orchestrator", "run"]
    a = subprocess.Popen([*command, *common], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "hpo-runs" / "hpo"
    until = time.monotonic() + 30
    while not list(folder.glob("spare-slot*.log")) and time.monotonic() < until:
        time.sleep(0.05)
    while not all("SETUP-OUTPUT" in p.read_text() for p in folder.glob("spare-slot*.log")) \
            and time.monotonic() < until:
        time.sleep(0.05)  # A's workers print before they sleep
    b = subprocess.run([*command, *common, "study.direction=maximize"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert b.returncode == 2, b.stderr
    assert a.wait(timeout=120) == 0
    logs = sorted(folder.glob("trial-*.log"))
    assert logs and all("SETUP-OUTPUT" in p.read_text() for p in logs), \
        {p.name: p.read_text()[:200] for p in logs}


def _wave_config(tmp_path: Path, study: str):  # type: ignore[no-untyped-def]
    from hpo_orchestrator.config import load_config

    return load_config([
        "objective=custom", "objective.target=tests.objectives:quadratic",
        "scheduler.parallel=1", "scheduler.gpus=none", f"scheduler.lease_dir={tmp_path / 'leases'}",
        f"storage.url=sqlite:///{tmp_path / 'hpo.db'}", f"study.name={study}"])


def test_a_refused_run_keeps_the_gitignore_another_runs_folder_relies_on(tmp_path: Path) -> None:
    """B (study b) makes hpo-runs and its .gitignore, A (study a) starts beside it, then B is
    refused: hpo-runs keeps its .gitignore, which A's folder is under."""
    from hpo_orchestrator.scheduler import FirstWave

    b = FirstWave(_wave_config(tmp_path, "b"), backend=NoGpuBackend("no GPU in this test"))
    b.start()
    a = FirstWave(_wave_config(tmp_path, "a"), backend=NoGpuBackend("no GPU in this test"))
    a.start()
    try:
        b.close()  # B refused
        assert (tmp_path / "hpo-runs" / "a").is_dir()
        assert (tmp_path / "hpo-runs" / ".gitignore").exists()
        assert not (tmp_path / "hpo-runs" / "b").exists()
    finally:
        a.close()


def test_a_refused_run_never_deletes_a_dangling_link_of_the_user(tmp_path: Path) -> None:
    """hpo-runs is a link to a disk not mounted: the run fails (the folder cannot be made),
    and the user's link stays."""
    from hpo_orchestrator.scheduler import FirstWave

    (tmp_path / "hpo-runs").symlink_to(tmp_path / "scratch-not-mounted")
    wave = FirstWave(_wave_config(tmp_path, "s"), backend=NoGpuBackend("no GPU in this test"))
    with pytest.raises(OSError):
        wave.start()
    wave.close()
    assert os.path.islink(tmp_path / "hpo-runs")


def test_start_up_logs_of_a_killed_run_on_this_host_go_at_the_next_start(tmp_path: Path) -> None:
    """A run killed -9 in its first wave leaves spare-slot<N>-<host>-<pid>.log: the next
    start on this host removes those of pids that are gone, not another host's, not a live
    orchestrator's."""
    import socket

    from hpo_orchestrator.scheduler import FirstWave

    folder = tmp_path / "hpo-runs" / "s"
    folder.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that was an orchestrator's and is no more
    host = socket.gethostname()
    dead = folder / f"spare-slot0-{host}-{gone.pid}.log"
    live = folder / f"spare-slot1-{host}-{os.getpid()}.log"
    other = folder / f"spare-slot0-another-host-{gone.pid}.log"
    for path in (dead, live, other):
        path.write_text("start-up output\n")
    wave = FirstWave(_wave_config(tmp_path, "s"), backend=NoGpuBackend("no GPU in this test"))
    try:
        wave.start()
        assert not dead.exists() and live.exists() and other.exists()
    finally:
        wave.close()


@pytest.mark.parametrize(("log_dir", "ignored"), [(None, True), ("new/logs", True), (".", False)])
def test_the_run_folders_gitignore_goes_only_into_a_folder_of_ours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_dir: str | None, ignored: bool) -> None:
    """hpo-runs, or a scheduler.log_dir made by the run, get a .gitignore of '*'; a folder of
    the user's that was there (log_dir=. is the project) does not."""
    from hpo_orchestrator.scheduler._logs import ensure_run_dir, run_dir

    monkeypatch.chdir(tmp_path)
    folder = ensure_run_dir(run_dir(f"sqlite:///{tmp_path / 'hpo.db'}", "s", log_dir))
    assert folder.is_dir()
    assert (folder.parent / ".gitignore").exists() is ignored
