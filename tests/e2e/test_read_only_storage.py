"""A sqlite database that is not as a run expects: read-only (a read-only mount, a file or folder
this user cannot write) or damaged. A run refuses it at its start (exit 2, nothing written)
saying which, with a hint that fits a file; status and report read a read-only one as it is.

The database is in WAL mode, as a run leaves it: sqlite then needs its -shm file beside the
database to read it, which a read-only place cannot hold (the readers open it ``immutable``).
The read-only mount needs root (CI runs as root and requires it, HPO_TEST_REQUIRE_ROOT=1;
elsewhere it is skipped with that reason); the permission case runs as nobody under root.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tests.conftest import cli_env, mounted, remount, run_cli

RUN = ("run", "objective=custom", "objective.target=tests.objectives:quadratic",
       "study.name=ro", "study.n_trials=5")


def _wal_study(path: Path) -> None:
    """A study of three finished trials in a WAL database, closed (no -wal or -shm left)."""
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(storage=storage, study_name="ro")
    for x in (0.1, 0.2, 0.3):
        trial = study.ask()
        study.tell(trial, trial.suggest_float("x", 0, 1) + x)
    storage.engine.dispose()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def _reads_and_refuses(where: Path, out: Path, as_user: list[str]) -> None:
    """status, status --json and report read the study in ``where``; a run is refused."""
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*as_user, sys.executable, "-m", "hpo_orchestrator", *args],
                              cwd=where, env={**cli_env(), "HOME": str(out)}, capture_output=True,
                              text=True, timeout=240)

    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "finished 3" in status.stdout
    as_json = cli("status", "--json")
    assert as_json.returncode == 0 and '"study": "ro"' in as_json.stdout, as_json.stderr
    report = cli("report", "--out", str(out / "r.html"))
    assert report.returncode == 0, report.stderr
    assert (out / "r.html").stat().st_size > 0
    run = cli(*RUN, f"scheduler.log_dir={out / 'logs'}", f"artifacts.store={out / 'art'}")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "error: hpo.db is read-only: " in run.stderr
    assert f"hint: a run writes its trials there: make it writable, or copy it where you can " \
           f"write (cp hpo.db {out / 'hpo.db'}) and run with storage.url=sqlite:///" \
           f"{out / 'hpo.db'}; status and report read it as it is" in run.stderr
    assert "Traceback" not in run.stderr
    assert sorted(p.name for p in where.iterdir()) == ["hpo.db"]  # nothing written beside it


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder that nobody (uid 65534) can enter, as /tmp (pytest's tmp_path is root's)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as made:
        folder = Path(made)
        folder.chmod(0o755)
        yield folder


def test_a_database_on_a_read_only_mount_is_read_and_a_run_refused(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    _wal_study(source / "hpo.db")
    with mounted(tmp_path / "ro", "--bind", str(source), what="a read-only bind mount") as view:
        remount(view, "bind", "ro")
        _reads_and_refuses(view, tmp_path, [])
        run = run_cli(view, *RUN)  # with its run folder beside the database: still refused
        assert run.code == 2 and "it is on a read-only file system" in run.stderr, run.stderr


def test_a_database_this_user_cannot_write_is_read_and_a_run_refused(shared_tmp: Path) -> None:
    """The file 0444 in a folder 0555: as nobody under root, else as the user running this."""
    where, out = shared_tmp / "db", shared_tmp / "out"
    where.mkdir()
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    _wal_study(where / "hpo.db")
    (where / "hpo.db").chmod(0o444)
    where.chmod(0o555)
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] \
        if os.geteuid() == 0 else []
    try:
        _reads_and_refuses(where, out, as_user)
    finally:
        where.chmod(0o755)


@pytest.mark.parametrize("command", [("status",), ("report", "--out", "r.html"), RUN])
def test_a_damaged_database_gets_a_hint_for_a_file(tmp_path: Path, command: tuple[str, ...]) -> None:
    _wal_study(tmp_path / "hpo.db")
    with open(tmp_path / "hpo.db", "r+b") as damaged:  # pages of the tables, not the header
        damaged.seek(8192)
        damaged.write(b"\xff" * 8192)
    result = run_cli(tmp_path, *command)
    assert result.code == 2, result.stdout + result.stderr
    assert "error: cannot open storage sqlite:///hpo.db: " in result.stderr
    assert "malformed" in result.stderr
    assert "hint: the file is damaged (copied while a run wrote it, a full disk, a crash): " \
           "sqlite3 hpo.db 'PRAGMA integrity_check' says where" in result.stderr
    assert "server" not in result.stderr and "credentials" not in result.stderr
