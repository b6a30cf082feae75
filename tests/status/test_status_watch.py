"""``status --watch`` as people use it: started beside a run before the run has made its
database and study, it waits and says so (not exit 2); with its output to a file or a pipe, it
prints one plain summary per interval, each under a line with its time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from tests.conftest import cli_env


def _until(condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes],
           timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"status --watch ended ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"status --watch never {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("study", ["w", None])
def test_watch_waits_for_the_run_to_create_the_study_then_prints_each_interval(
        tmp_path: Path, study: str | None) -> None:
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    named = ["--study", study] if study else []
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "hpo_orchestrator", "status", "--watch",
                                 "--interval", "0.5", *named], cwd=tmp_path, env=cli_env(),
                                stdout=stdout, stderr=stderr)
    try:
        _until(lambda: b"waiting for a run to create it" in err.read_bytes(), "said it waits",
               proc)
        assert err.read_text().startswith("no database at hpo.db: waiting for a run to create "
                                          "it (checking every 0.5 s; Ctrl-C to stop)")
        assert not (tmp_path / "hpo.db").exists()  # it waits: it creates nothing
        time.sleep(1.2)  # a few more checks: still waiting, said once
        assert err.read_text().count("waiting") == 1

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        made = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="w")
        made.tell(made.ask(), 1.0)
        _until(lambda: out.read_text().count("finished 1") >= 1, "printed the study", proc)
        made.tell(made.ask(), 2.0)
        _until(lambda: "finished 2" in out.read_text(), "printed the next summary", proc)
        text = out.read_text()
        assert text.startswith("--- ") and text.count("--- ") >= 2
        assert "\x1b[" not in text  # plain: no cursor moves, no colours
        assert "trials by state" in text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 130


def test_watch_refuses_what_waiting_cannot_mend(tmp_path: Path) -> None:
    """A file that is not a database is not "not yet created": exit 2 at once, as without
    --watch."""
    (tmp_path / "hpo.db").write_bytes(b"not a database at all" * 100)
    done = subprocess.run([sys.executable, "-m", "hpo_orchestrator", "status", "--watch",
                           "--interval", "0.5"], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "error:" in done.stderr and "waiting" not in done.stderr


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("command", [("status", "--watch", "--interval", "0.2"),
                                     ("logs", "0", "--follow")])
def test_ctrl_c_ends_a_watch_started_with_sigint_ignored(tmp_path: Path,
                                                         command: tuple[str, ...]) -> None:
    """The two commands only a signal ends say "Ctrl-C to stop", and SIGINT stops them (exit
    130) even where they inherit it ignored: a shell without job control starts a script's
    background jobs (`hpo-orchestrator status --watch > log &`) so, and make test run that
    way left the watch running past the test's SIGINT. Each waits for its event first: the
    watch's summary, the follow's first line."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="hpo")
    trial = study.ask()  # RUNNING: the follow waits for more of its output
    log = tmp_path / "trial-0.log"
    log.write_text("first line\n")
    trial.set_user_attr("hpo.log_path", str(log))
    out, err = tmp_path / "cmd.out", tmp_path / "cmd.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "hpo_orchestrator", *command],
                                cwd=tmp_path, env=cli_env(), stdout=stdout, stderr=stderr,
                                preexec_fn=_ignoring_sigint)
    try:
        shown = "first line" if command[0] == "logs" else "trials by state"
        _until(lambda: shown in out.read_text(), "printed", proc)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 130, err.read_text()
