"""Objectives that probe a trial's life as the orchestrator records it (when its pruning
decisions come, which processes outlive it), for tests; importable in child processes as
``tests.probes:NAME``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

__all__ = ["helper_setup", "paced_decisions", "uses_helper"]


def paced_decisions(trial: Any) -> float:
    """Three reports, each followed by ``should_prune``, $HPO_TEST_DECISION_GAP_S apart (and as
    long after the objective starts); test.decision_offsets: when each answer came back,
    seconds since the objective started (hpo.startup_s), to check hpo.first_decision_s."""
    gap = float(os.environ.get("HPO_TEST_DECISION_GAP_S", "1.5"))
    x = trial.suggest_float("x", 0.0, 1.0)
    entered = time.monotonic()
    offsets = []
    for step in (1, 2, 3):
        time.sleep(gap)
        trial.report(x, step)
        trial.should_prune()
        offsets.append(round(time.monotonic() - entered, 3))
    trial.set_user_attr("test.decision_offsets", offsets)
    return x


_helper: subprocess.Popen[bytes] | None = None


def helper_setup() -> None:
    """An ``objective.setup`` that starts a process its worker's trials use (a data server or
    a loader pool, say): it lives as long as the worker, not as a trial."""
    global _helper
    _helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def uses_helper(trial: Any) -> float:
    """test.helper: [the setup's helper pid, whether it still runs], as each trial finds it.
    Each trial lasts a few clock ticks: the sweep after a trial tells its processes from
    older ones by their start times, which Linux keeps in ticks (10 ms), so a helper started
    by a setup inside a trial of a few milliseconds could read as started in the next."""
    alive = _helper is not None and _helper.poll() is None
    trial.set_user_attr("test.helper", [_helper.pid if _helper else None, alive])
    time.sleep(0.05)
    return float(trial.suggest_float("x", 0.0, 1.0))
