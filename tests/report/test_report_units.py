"""The report's units and names (issue 30): the CPU chart in cores, counted once per moment;
timeline rows named as the run names its slots; the written path, and `make report`'s file
ignored by git."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.db import TrialRow
from hpo_orchestrator.report import lane_device
from hpo_orchestrator.report._data import CPU_AXIS, _Sample, _timeline, _utilization
from tests.conftest import REPO, run_cli


def test_cpu_chart_counts_cores_once_per_moment() -> None:
    """Two trials one after the other on one core, inside one bucket of the chart (a long
    study's buckets hold many seconds), at 100 % of a core each: one core in use, not the sum
    of both trials' means (200, read as '% of one core': 296 % on a 2-core host)."""
    samples = [_Sample(float(t), 1, None, None, 100.0, "h") for t in range(5)]
    samples += [_Sample(float(t), 2, None, None, 100.0, "h") for t in range(5, 10)]
    samples += [_Sample(14_985.0 + t, 3, None, None, 50.0, "h") for t in range(3)]
    samples.append(_Sample(15_000.0, 4, None, None, 0.0, "h"))  # 15,000 s: buckets of 10 s
    series = _utilization(samples, 0.0, "cpu", 1)
    assert [s.device for s in series] == ["cpu"]
    assert series[0].util[0] == pytest.approx(1.0, rel=1e-3)
    assert series[0].util[-2] == pytest.approx(0.5 * 0.3, rel=1e-3)  # 3 s of a 10 s bucket at half a core
    assert "cores" in CPU_AXIS and "%" not in CPU_AXIS


def _row(number: int, gpu: int | None, start: float, end: float) -> TrialRow:
    return TrialRow(number, "COMPLETE", "h", gpu, start, end, None, None, None, None, None, 3)


def test_timeline_rows_are_named_as_the_slots() -> None:
    """CPU slots are cpu0, cpu1, ... (the run's names); the rows were cpu #1, cpu #2."""
    rows = [_row(0, None, 0, 10), _row(1, None, 1, 10), _row(2, 0, 0, 5), _row(3, 0, 1, 5)]
    lanes, bars = _timeline(rows, {}, 0.0, 1)
    assert lanes == ["cpu0", "cpu1", "gpu0 #1", "gpu0 #2"]
    assert [b.lane for b in sorted(bars, key=lambda b: b.number)] == lanes
    assert {lane_device(lane) for lane in lanes} == {"cpu", "gpu0"}
    several, _ = _timeline([r._replace(host="a") for r in rows], {}, 0.0, 2)
    assert several[:2] == ["a:cpu0", "a:cpu1"] and lane_device("a:cpu1") == "a:cpu"


def test_report_prints_where_it_wrote_and_make_report_s_file_is_ignored(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="s")
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    result = run_cli(tmp_path, "report", "--out", "r.html")
    assert result.code == 0, result.stderr
    assert f"wrote {tmp_path / 'r.html'}: study 's'" in result.stdout  # a path that opens anywhere
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "/report.html" in ignored and "/report.png" in ignored  # make report's, in the checkout
