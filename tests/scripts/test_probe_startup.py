"""scripts/probe_startup.py, which docs/quality/runs.md ("Ours' start-up") cites: each run's
launch-to-objective time and ours' phases, in the order a run goes through them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a study (and a plain Optuna script) in subprocesses

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_times_both_sides_and_ours_phases_in_order(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_startup.py"),
                           "--repeat", "1", "--out", str(out)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    ours, plain = json.loads(out.read_text())
    assert (ours["kind"], plain["kind"]) == ("ours", "optuna")
    assert ours["returncode"] == 0 and plain["returncode"] == 0
    labels = [label for label, _ in ours["phases"]]
    assert labels == ["python started", "CLI imported", "first wave started", "objective imported",
                      "storage opened", "study created", "orchestrator built",
                      "first wave ready", "first trial sent"]
    times = [at for _, at in ours["phases"]]
    assert times == sorted(times)
    cpu = ours["phases_main_cpu_s"]  # the main process's CPU seconds at each phase
    assert len(cpu) == len(times) and cpu == sorted(cpu)
    # each objective was entered once, after its launch and before its process ended, after
    # some CPU of its process (ours: the worker's)
    for run in (ours, plain):
        assert 0 < run["objective_entered_s"] < run["exit_s"]
        assert run["objective_process_cpu_s"] > 0
    assert done.stdout.splitlines()[-1].startswith("median of 1: ours ")
