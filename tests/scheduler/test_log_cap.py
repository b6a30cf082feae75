"""Issue 28 item 4: a trial's log stays near scheduler.log_max_mib whatever it prints, and the
rotation copies at most the cap, from a thread of its own (never the orchestrator's loop)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hpo_orchestrator.scheduler import _logs
from hpo_orchestrator.scheduler._logs import LogCap, cap_log
from tests.conftest import run_cli

MIB = 2**20


def test_rotation_keeps_only_the_last_cap_of_bytes(tmp_path: Path) -> None:
    log = tmp_path / "trial-0.log"
    log.write_bytes(b"a" * (30 * MIB) + b"z" * MIB)
    assert cap_log(log, MIB)
    assert log.stat().st_size == 0
    assert log.with_name("trial-0.log.1").read_bytes() == b"z" * MIB


def test_the_loop_only_hands_over_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check() neither stats nor copies in the caller's thread; an ended trial's log (no longer
    handed over) and every log at close() still get a look."""
    looked: list[tuple[Path, str]] = []
    monkeypatch.setattr(_logs, "cap_log", lambda path, _limit: looked.append(
        (path, threading.current_thread().name)) or False)
    cap = LogCap(1)
    cap.CHECK_S = 0.01
    a, b = tmp_path / "trial-0.log", tmp_path / "trial-1.log"
    cap.check([a, None, b])
    assert not [name for _, name in looked if name == threading.current_thread().name]
    cap.check([b])  # trial 0 ended
    cap.close()
    assert {path for path, _ in looked} == {a, b}
    assert not [name for _, name in looked if name not in ("hpo-log-cap", "MainThread")]


@pytest.mark.slow
def test_a_trial_printing_30_mib_under_a_1_mib_cap(tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(
        "import sys, time\n"
        "def objective(trial):\n"
        "    line = 'x' * 1023 + '\\n'\n"
        "    for i in range(30 * 1024):\n"
        "        sys.stdout.write(line)\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.5)  # a rotation's copy-then-truncate loses what is written meanwhile\n"
        "    sys.stdout.write('the end\\n')\n"
        "    return trial.suggest_float('x', 0, 1)\n")
    result = run_cli(tmp_path, "run", "objective=custom", "objective.target=noisy:objective",
                     "study.n_trials=2", "scheduler.log_max_mib=1")
    assert result.code == 0, result.stderr
    logs = sorted((tmp_path / "hpo-runs").rglob("trial-*.log*"))
    assert {p.name for p in logs} >= {"trial-0.log", "trial-1.log"}
    for path in logs:
        assert path.stat().st_size <= MIB, (path, path.stat().st_size)
    for number in (0, 1):  # the end of what it printed is kept
        log = tmp_path / "hpo-runs" / "hpo" / f"trial-{number}.log"
        tail = log.read_bytes() + log.with_name(log.name + ".1").read_bytes() \
            if log.with_name(log.name + ".1").exists() else log.read_bytes()
        assert b"the end" in tail
