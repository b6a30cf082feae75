"""``hpo.first_decision_s``: seconds from a trial's spawn to the FIRST answer to its
``should_prune`` (scheduler/_calls.py, scheduler/_records.py). status's slow_startup finding
compares it with ``hpo.startup_s`` to tell a slow start-up from a slow first step, so a value
taken at a later decision, or carried from a worker's earlier trial, would misread both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, trial_rows

pytestmark = pytest.mark.slow

GAP_S = 1.5  # between the objective's start and each decision; the first comes after one gap


def test_first_decision_is_the_first_answer_of_each_trial_of_a_reused_worker(tmp_path: Path) -> None:
    """Two trials in one reused worker, decisions about 1.5, 3.0 and 4.5 s after each
    objective started: first_decision_s - startup_s is the first (within half a gap), for
    the worker's second trial too (measured from that trial's spawn)."""
    result = run_cli(tmp_path, "run", "objective=custom",
                     "objective.target=tests.probes:paced_decisions",
                     "scheduler.parallel=1", "scheduler.worker_mode=reuse", "study.n_trials=2",
                     env={"HPO_TEST_DECISION_GAP_S": str(GAP_S)})
    assert result.code == 0, result.stderr
    rows = sorted(trial_rows(result.db), key=lambda r: r["number"])
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]
    assert rows[0]["attrs"]["hpo.pid"] == rows[1]["attrs"]["hpo.pid"]  # one worker ran both
    for row in rows:
        attrs = row["attrs"]
        first, second, _third = attrs["test.decision_offsets"]
        assert second - first >= GAP_S - 0.05
        waited = attrs["hpo.first_decision_s"] - attrs["hpo.startup_s"]
        assert abs(waited - first) < GAP_S / 2, (row["number"], waited, attrs["test.decision_offsets"])
