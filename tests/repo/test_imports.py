"""Production code loads the test fakes only when the user asks for them (docs/DESIGN.md §3.4).

The layout's own rules (no import circle, a package entered through its face): test_layout.py."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli_env

_IMPORT_ALL = """
import importlib, pathlib, sys
import hpo_orchestrator
root = pathlib.Path(hpo_orchestrator.__file__).parent
fakes = ("hpo_orchestrator.testing", "hpo_orchestrator.gpu._fake")
for path in sorted(root.rglob("*.py")):  # pkgutil.walk_packages would import testing/ itself
    parts = path.relative_to(root.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if not name.startswith(fakes) and parts[-1] != "__main__":
        importlib.import_module(name)
from hpo_orchestrator.gpu import open_backend
backend = open_backend()
print(backend.name, any(m.startswith(fakes) for m in sys.modules))
"""


def _backend_and_testing_loaded(env: dict[str, str] | None = None) -> list[str]:
    return subprocess.run([sys.executable, "-c", _IMPORT_ALL], env=cli_env(env), capture_output=True,
                          text=True, check=True).stdout.split()


def test_no_production_module_imports_the_fakes() -> None:
    name, testing_loaded = _backend_and_testing_loaded()
    assert name in ("nvml", "none") and testing_loaded == "False"


def test_the_fake_backend_is_opened_when_asked_for() -> None:
    assert _backend_and_testing_loaded({"HPO_ORCHESTRATOR_FAKE_GPUS": "2"}) == ["fake", "True"]


_STATUS_JSON = """
import sys
from hpo_orchestrator.cli import main
code = main(["status", "--json", "--storage", sys.argv[1]])
print(code, "sqlalchemy" in sys.modules, file=sys.stderr)
"""


def test_status_json_reads_a_sqlite_study_without_sqlalchemy(tmp_path: Path) -> None:
    """Importing SQLAlchemy costs more than reading a study's tally (docs/BENCHMARKS.md
    "status from a kept tally"): status --json of a sqlite study does without, from its kept
    tally or, without one, from a fresh fold of every trial; its output is the engine path's
    (a URL naming the driver reads through SQLAlchemy)."""
    from tests.status.test_status_numbers import _study
    from tests.tally.test_tally import _advance

    url = _study(tmp_path / "s.db", 20)
    _advance(url, rebuild=True)

    def status(url: str) -> tuple[dict[str, Any], str]:
        done = subprocess.run([sys.executable, "-c", _STATUS_JSON, url], env=cli_env(), check=True,
                              capture_output=True, text=True, cwd=tmp_path)
        return json.loads(done.stdout), done.stderr.strip()

    kept, said = status(url)
    assert said == "0 False"
    engine, said = status(url.replace("sqlite:///", "sqlite+pysqlite:///"))
    assert said == "0 True"
    with sqlite3.connect(tmp_path / "s.db") as con:  # without the tally: a fresh fold
        con.execute("DELETE FROM hpo_study_tally")
    fresh, said = status(url)
    assert said == "0 False"
    for report in (kept, engine, fresh):  # the running trial's times are "now": a moment apart
        report.pop("wall_s")
        report.pop("active_s")
        for running in report["running"]:
            running.pop("elapsed_s")
            running.pop("heartbeat_age_s")
        for device in report["per_device"]:
            device.pop("busy_fraction")
            device.pop("active_s")
    assert kept == engine == fresh


def test_every_name_a_package_exports_resolves() -> None:
    """A package's ``__all__`` names only what it has: a name left behind by a removal fails
    ``from package import *`` and readers alike."""
    import importlib

    for name in ("db", "scheduler", "placement", "tally", "worker", "telemetry", "config", "gpu",
                 "status", "report", "pruning", "cluster", "artifacts", "objectives", "cli", "study",
                 "testing"):
        package = f"hpo_orchestrator.{name}"
        module = importlib.import_module(package)
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, f"{package}.__all__ names what it lacks: {missing}"


_LIGHT_FACES = """
import sys
import hpo_orchestrator.db, hpo_orchestrator.status
print("sqlalchemy" in sys.modules, "optuna" in sys.modules)
import hpo_orchestrator.scheduler
print("optuna" in sys.modules)
"""


def test_the_faces_a_command_starts_with_stay_light() -> None:
    """``status --json`` reads through db/ and status/ without SQLAlchemy or Optuna (their
    public modules db.connect, db.tables hold what is SQLAlchemy's); a run lays out its slots
    and starts its first workers through scheduler/ before it imports Optuna (the loop is
    scheduler.orchestrator)."""
    done = subprocess.run([sys.executable, "-c", _LIGHT_FACES], env=cli_env(), check=True,
                          capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False", "False"]


_NO_DRIVER = """
import ctypes, sys
from hpo_orchestrator.gpu import NvmlBackend
def missing(name, *args, **kwargs):
    raise OSError(name + ": cannot open shared object file")
ctypes.CDLL = missing
print(NvmlBackend.open())
print("pynvml" in sys.modules)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="NVML's library name is Linux's")
def test_a_host_without_the_driver_says_so_without_importing_pynvml() -> None:
    """The reason is nvidia-ml-py's own words for a missing libnvidia-ml.so.1, found without
    importing it (its import is 30 ms of every run's start-up on a host without a GPU)."""
    done = subprocess.run([sys.executable, "-c", _NO_DRIVER], env=cli_env(), check=True,
                          capture_output=True, text=True)
    reason, imported = done.stdout.splitlines()
    assert reason == ("NVML could not start (NVML Shared Library Not Found); no NVIDIA driver on "
                      "this machine?")
    assert imported == "False"


_COMMAND_MODULES = """
import sys
from hpo_orchestrator.cli import main
code = main(sys.argv[1:])
print(code, sorted({m.split(".")[1] for m in sys.modules if m.startswith("hpo_orchestrator.")}),
      file=sys.stderr)
"""


def test_the_commands_leave_the_objectives_api_unloaded(tmp_path: Path) -> None:
    """``phase`` and ``slot_info`` are the objectives' (their package brings multiprocessing's
    connections: 80 ms of every command's start on the 2-core VM); a command loads them only
    when it runs trials. ``from hpo_orchestrator import phase`` still works."""
    from tests.status.test_status_numbers import _study

    url = _study(tmp_path / "s.db", 5)
    done = subprocess.run([sys.executable, "-c", _COMMAND_MODULES, "status", "--json",
                           "--storage", url], env=cli_env(), check=True, capture_output=True,
                          text=True, cwd=tmp_path)
    code, packages = done.stderr.strip().split(" ", 1)
    assert code == "0" and "'status'" in packages and "'worker'" not in packages
    api = subprocess.run([sys.executable, "-c", "from hpo_orchestrator import phase, slot_info, "
                          "SlotInfo; print(phase.__module__, SlotInfo.__name__)"],
                         env=cli_env(), check=True, capture_output=True, text=True).stdout.split()
    assert api == ["hpo_orchestrator.worker._runtime", "SlotInfo"]


_RUN_PATH = """
import sys
from hpo_orchestrator.cli._parser import build_parser
build_parser().parse_args(["run"])
print("importlib.metadata" in sys.modules)
import hpo_orchestrator.runner
print("sqlalchemy.dialects.postgresql" in sys.modules)
"""


def test_a_run_on_sqlite_starts_without_the_postgresql_dialect_or_package_metadata() -> None:
    """Each is 0.035-0.05 s of a run's start-up on 2 cores (docs/quality/runs.md, "Ours'
    start-up"): the version is read when --version asks for it, SQLAlchemy's PostgreSQL
    dialect when a storage is PostgreSQL."""
    done = subprocess.run([sys.executable, "-c", _RUN_PATH], env=cli_env(), check=True,
                          capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"]


@pytest.mark.postgres
def test_the_summary_s_partial_indexes_are_partial_on_postgresql(postgres_url: str) -> None:
    """Their WHERE is set for PostgreSQL when the tables are made (not at import): a flagged
    or failed trial is found without a scan there as on sqlite."""
    import sqlalchemy

    from hpo_orchestrator.db.tables import ensure_tables
    from tests.scheduler.test_reliability_storage import _fresh_postgres

    with _fresh_postgres(postgres_url) as fresh:
        engine = sqlalchemy.create_engine(fresh)
        try:
            ensure_tables(engine)
            ensure_tables(engine)  # a second run finds them
            with engine.connect() as connection:
                made = dict(connection.execute(sqlalchemy.text(
                    "SELECT indexname, indexdef FROM pg_indexes "
                    "WHERE tablename = 'hpo_trial_summary'")).all())
        finally:
            engine.dispose()
    assert "WHERE ((state)::text = 'FAIL'::text)" in made["ix_hpo_summary_failed"]
    assert "WHERE ((gpu_verified = false) OR (params_mismatch IS NOT NULL) OR " \
        "(fail_reason IS NOT NULL))" in made["ix_hpo_summary_flagged"]
    assert "WHERE" not in made["ix_hpo_summary_duration"]
