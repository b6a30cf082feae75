"""``--common-start K`` (scripts/bench_quality.py): every contender of a seed begins with the
same K random points of the search space, queued in its study before the launch (common
random numbers: which side draws a good start-up point first is no longer compared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.config import LIGHTGBM_SPACE
from scripts.benchmarking.workloads import WORKLOADS, start_points

REPO = Path(__file__).resolve().parents[2]


def test_start_points_are_the_seeds_and_of_the_workloads_space() -> None:
    first, again = start_points(WORKLOADS["a"], 3, 4), start_points(WORKLOADS["b"], 3, 4)
    assert first == again and len(first) == 4  # a and b share the space: the same points
    assert all(point.keys() == LIGHTGBM_SPACE.keys() for point in first)
    assert start_points(WORKLOADS["a"], 4, 4) != first
    cnn = start_points(WORKLOADS["c"], 3, 2)
    assert [sorted(p) for p in cnn] == [sorted(["lr", "channels", "depth", "dropout",
                                                "weight_decay", "batch_size"])] * 2


def test_common_start_is_refused_with_ray_and_below_zero(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "scripts" / "bench_quality.py"), "--out", str(tmp_path),
               "--workload", "a", "--seeds", "1", "--budget", "5"]
    for extra in (["--pair", "ours,ray-asha", "--common-start", "10"],
                  ["--contenders", "ours", "--common-start", "-1"]):
        done = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith("error: --common-start"), done.stderr


@pytest.mark.slow
@pytest.mark.long
def test_both_contenders_of_a_seed_begin_with_the_same_points(tmp_path: Path) -> None:
    (tmp_path / "targets.json").write_text(json.dumps({"a": {
        "contender": "optuna-cpu-t1", "budget_s": 10.0, "seeds": 3, "seed_list": [101, 102, 103],
        "targets": {"10%": 0.7, "50%": 0.6, "100%": 0.5}}}))
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_quality.py"), "--out", str(tmp_path),
         "--workload", "a", "--scale", "0.05", "--budget", "12", "--seeds", "1", "--pair",
         "ours,optuna-cpu-t1", "--common-start", "3", "--no-test"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = start_points(WORKLOADS["a"], 1, 3)
    group = "pair-ours-optuna-cpu-t1-start3"
    for name in ("ours", "optuna-cpu-t1"):
        url = f"sqlite:///{tmp_path / 'runs' / 'a' / group / f'{name}-s1' / 'bench.db'}"
        trials = sorted(optuna.load_study(study_name="bench", storage=url).trials,
                        key=lambda t: t.number)
        assert [t.params for t in trials[:3]] == expected, name
        assert len(trials) > 3  # and the search went on from there
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert {r["group"] for r in runs} == {"pair:ours+optuna-cpu-t1:start3"}
    assert "the same 3 random points" in (tmp_path / "results.md").read_text()
