"""The package as a user gets it: a wheel installed into a fresh virtual environment runs the
default study from a folder that knows nothing of this repository (docs/DESIGN.md §2.7)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

pytestmark = pytest.mark.slow

# What a build reads; everything else (the venv, caches, old build/ output that setuptools
# would put into the wheel, databases) stays behind.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                     ".*_cache", ".wheelhouse", "*.db", "*.db-*", "outputs", "multirun")


def _build_wheel(tmp_path: Path) -> Path:
    """Build from a copy of the source tree, so stale build/ files never reach the wheel.
    No build isolation: the project's venv has setuptools, and GPU nodes are often offline."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=_NOT_SOURCE)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(wheels), str(source)], check=True, capture_output=True)
    [wheel] = wheels.glob("hpo_orchestrator-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed and nothing else of the project. The dependencies
    (torch, optuna, ...) come from this interpreter's site-packages through a .pth line: a
    plain path, so the editable install's finder there is never loaded."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # --force-reinstall: pip counts the project's editable install, seen through the .pth
    # line or PYTHONPATH, as this very wheel already installed, and would skip it
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", "--force-reinstall", str(wheel)], check=True, capture_output=True)
    return venv


@pytest.mark.long
def test_wheel_in_a_fresh_venv_runs_the_default_study_from_any_folder(tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, _build_wheel(tmp_path))
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in cli_env().items()
           if k not in ("PYTHONPATH", "HPO_ORCHESTRATOR_CONF", "VIRTUAL_ENV")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "hpo-orchestrator"), *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=240)

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import hpo_orchestrator; from hpo_orchestrator.config import config_dir; "
         "print(hpo_orchestrator.__file__); print(config_dir().resolve())"],
        cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel, not the checkout
    # The default study (the built-in LightGBM objective, as `make hpo`), made short.
    result = run("run", "study.n_trials=3", "scheduler.parallel=2", "scheduler.gpus=none")
    assert result.returncode == 0, result.stderr
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    counts = json.loads(status.stdout)["states"]
    assert sum(entry["count"] for entry in counts.values()) == 3 and counts["FAIL"]["count"] == 0, counts
    # The study is Optuna's: its own reader, as the README says, with what the wheel requires
    frame = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import optuna; print(len(optuna.load_study("
         "study_name='hpo', storage='sqlite:///hpo.db').trials_dataframe()))"],
        cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert (frame.returncode, frame.stdout.strip()) == (0, "3"), frame.stderr


def test_the_wheel_requires_what_optuna_needs_to_read_the_study(tmp_path: Path) -> None:
    """``study.trials_dataframe()`` failed on a fresh install: pandas is Optuna's optional
    dependency, so the wheel must require it itself."""
    import zipfile

    with zipfile.ZipFile(_build_wheel(tmp_path)) as wheel:
        [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        required = [line.split(":", 1)[1].strip() for line in
                    wheel.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.split(">")[0].split("=")[0].strip() == "pandas" for r in required
               if "extra ==" not in r), required
