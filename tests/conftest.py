from __future__ import annotations

import atexit
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hpo_orchestrator.placement._leases import LEASE_DIR_ENV

REPO = Path(__file__).resolve().parents[1]
# The test objectives (tests/objectives/__init__.py, tests/misbehaving.py) are imported by name in the
# trials' own processes (objective.target=tests.objectives:NAME), which run in a test's
# folder: the checkout's root on PYTHONPATH lets every process a test starts find them.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
# pytest-xdist's workers start with COLUMNS=80 where the run that started them had none: the
# commands run in-process (cli.main) would then wrap their output at 80 columns in a worker
# and not in a plain pytest. Each worker gets the COLUMNS (or none) of the run that began it.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["HPO_TEST_COLUMNS"] = os.environ.get("COLUMNS", "")
elif os.environ.get("HPO_TEST_COLUMNS") == "":
    os.environ.pop("COLUMNS", None)


@dataclass
class RunResult:
    code: int
    stdout: str
    stderr: str
    db: Path


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without a fake-GPU spec (unless ``env`` sets one)."""
    inherited = {k: v for k, v in os.environ.items() if k != "HPO_ORCHESTRATOR_FAKE_GPUS"
                 and not (k == "MUTANT_UNDER_TEST" and v == "stats")}
    # MUTANT_UNDER_TEST=stats: mutmut's pass that maps each function to its tests records calls
    # in pytest's process only; a command run from here would look for mutmut's configuration
    # in the test's folder and fail (docs/MUTATION.md, "mutmut"). A mutant's name is kept: the
    # command runs that mutant, as the test's own process does.
    # A test's fake GPUs count only its own processes, not those of a test run beside it
    # (another pytest on this host); the orchestrators of one test share one fake machine.
    # Its GPU leases too: fake GPUs have the same UUIDs in every test, so with the host-wide
    # default lease folder a test run beside it held "GPU 0" and this test's trials all ran
    # on GPU 1 (a scheduler.lease_dir given on the command line still wins).
    machine = {"HPO_FAKE_GPU_MACHINE": f"test-{os.getpid()}-{_test_serial}",
               LEASE_DIR_ENV: str(_LEASES / f"test-{_test_serial}")}
    return {**inherited, "COLUMNS": "200", **machine, **(env or {})}


# This pytest's lease folders (one per test), removed when it exits.
_LEASES = Path(tempfile.mkdtemp(prefix="hpo-test-leases-"))
atexit.register(shutil.rmtree, _LEASES, ignore_errors=True)
# Studies run inside this process (run_study) get this pytest's own folder too: in the
# host-wide default, the CPU-core presences of another pytest's runs (an xdist worker beside
# this one) would make a run here note them, and their GPU leases would hold "GPU 0".
os.environ.setdefault(LEASE_DIR_ENV, str(_LEASES / "in-process"))


_in_slow_test = False
_test_serial = 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Noted before the test's fixtures are set up (a module-scoped fixture may run a study)."""
    global _in_slow_test, _test_serial
    _in_slow_test = item.get_closest_marker("slow") is not None
    _test_serial += 1


def _require_slow(what: str) -> None:
    """Keep `make test-fast` fast: a test that runs a study in real processes must say so."""
    if not _in_slow_test:
        pytest.fail(f"this test {what}: mark it @pytest.mark.slow (make test-fast leaves those out)")


def start_cli(tmp_path: Path, *args: str,
              env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``hpo-orchestrator`` in ``tmp_path`` without waiting (to signal or kill it)."""
    _require_slow(f"starts 'hpo-orchestrator {' '.join(args[:1])}'")
    return subprocess.Popen([sys.executable, "-m", "hpo_orchestrator", *args], cwd=tmp_path,
                            env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run_cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = 240) -> RunResult:
    """Run ``hpo-orchestrator`` as a real process in ``tmp_path`` (storage sqlite:///hpo.db)."""
    proc = subprocess.run([sys.executable, "-m", "hpo_orchestrator", *args], cwd=tmp_path,
                          env=cli_env(env), capture_output=True, text=True, timeout=timeout)
    if args[:1] == ("run",) and "--show-config" not in args and proc.returncode == 0:
        _require_slow("ran a study")  # bad-input runs stop before any study: fine in the fast tier
    return RunResult(proc.returncode, proc.stdout, proc.stderr, tmp_path / "hpo.db")


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals that overlap at any moment (an end before a start at a tie)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def trial_rows(db: Path, study: str = "hpo") -> list[dict[str, Any]]:
    """Every trial of the study with its user attrs, read with plain SQL."""
    with sqlite3.connect(db) as con:
        trials = con.execute(
            "SELECT t.trial_id, t.number, t.state, t.datetime_start, t.datetime_complete "
            "FROM trials t JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = ?",
            (study,)).fetchall()
        rows = []
        for trial_id, number, state, start, end in trials:
            attrs = {k: json.loads(v) for k, v in con.execute(
                "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = ?",
                (trial_id,))}
            rows.append({"trial_id": trial_id, "number": number, "state": state,
                         "start": start, "end": end, "attrs": attrs})
    return rows


def rows_while_running(tmp_path: Path) -> list[dict[str, Any]]:
    """trial_rows of tmp_path/hpo.db while a run may still be creating it (then: none yet)."""
    db = tmp_path / "hpo.db"
    try:
        return trial_rows(db) if db.exists() else []
    except Exception:  # the database is being created
        return []


@pytest.fixture
def cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> RunResult:
        return run_cli(tmp_path, *args, env=env, timeout=timeout)
    return _run


# pytest-xdist's workers (make test runs several): each has a database of its own, made from
# HPO_TEST_POSTGRES_URL's (`test` -> `test_gw0`, ...) at first use, so that no test sees
# another worker's studies or tables.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_SERVER_URL = os.environ.get("HPO_TEST_POSTGRES_URL")


def _worker_url(url: str | None) -> str | None:
    if not url or not _XDIST_WORKER:
        return url
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_{_XDIST_WORKER}").render_as_string(
        hide_password=False)


POSTGRES_URL = _worker_url(_SERVER_URL)


def _postgres_unreachable() -> str | None:
    if not POSTGRES_URL or not _SERVER_URL:
        return "HPO_TEST_POSTGRES_URL is not set (e.g. postgresql+psycopg://postgres@127.0.0.1/test)"
    import sqlalchemy

    try:
        if POSTGRES_URL != _SERVER_URL:
            _create_database(_SERVER_URL, sqlalchemy.engine.make_url(POSTGRES_URL).database)
        with sqlalchemy.create_engine(POSTGRES_URL).connect() as con:
            con.execute(sqlalchemy.text("SELECT 1"))
    except Exception as exc:
        return f"PostgreSQL at HPO_TEST_POSTGRES_URL is not reachable: {exc}"
    return None


def _create_database(server_url: str, name: str | None) -> None:
    """This worker's database, made once (it stays for the next run, as `test` does)."""
    import sqlalchemy

    admin = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as con:
            if con.execute(sqlalchemy.text("SELECT 1 FROM pg_database WHERE datname = :n"),
                           {"n": name}).first() is None:
                con.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test server's URL; skips with the reason, or fails in CI (HPO_TEST_REQUIRE_POSTGRES=1)."""
    reason = _postgres_unreachable()
    if reason:
        if os.environ.get("HPO_TEST_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    assert POSTGRES_URL
    return POSTGRES_URL


def _root_or_skip(what: str) -> None:
    """Skip a test that mounts file systems where it cannot (not root, or no CAP_SYS_ADMIN in
    a container); CI runs as root (HPO_TEST_REQUIRE_ROOT=1), where it must run."""
    reason = None
    if os.geteuid() != 0:
        reason = f"needs root to mount {what} (CI runs it: HPO_TEST_REQUIRE_ROOT=1)"
    elif shutil.which("mount") is None or shutil.which("umount") is None:
        reason = f"needs mount and umount to mount {what}"
    if reason:
        if os.environ.get("HPO_TEST_REQUIRE_ROOT") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def mounted(target: Path, *options: str, what: str) -> Iterator[Path]:
    """``mount OPTIONS TARGET`` (made if missing) for the test, unmounted at its end; skips
    with a reason where it cannot mount (:func:`_root_or_skip`), fails where root cannot."""
    _root_or_skip(what)
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *options, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = f"cannot mount {what}: {done.stderr.strip()}"
        if os.environ.get("HPO_TEST_REQUIRE_ROOT") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def remount(target: Path, *options: str) -> None:
    """Change a mount of :func:`mounted` (``-o remount,size=4m``: room on a full disk)."""
    subprocess.run(["mount", "-o", ",".join(("remount", *options)), str(target)], check=True)


# `make test-gpu` sets HPO_TEST_REQUIRE_GPU=1: a run where every GPU test skipped (no GPU, no
# CUDA torch) or was deselected proves nothing about the GPUs, so it must not exit 0.
_gpu_tests_passed = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    global _gpu_tests_passed
    if report.when == "call" and report.passed and "gpu" in report.keywords:
        _gpu_tests_passed += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("HPO_TEST_REQUIRE_GPU") == "1" and exitstatus in (0, 5) \
            and not _gpu_tests_passed:
        session.exitstatus = 1
        sys.stderr.write("error: no GPU test ran (HPO_TEST_REQUIRE_GPU=1): see the skip reasons "
                         "above (-rs)\n")
