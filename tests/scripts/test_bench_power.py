"""Power before runs (scripts/benchmarking/power.py, scripts/bench_power.py): known answers
where every simulated study must come out alike, Kaplan-Meier by hand, and the tool on the
kept curves of docs/quality-data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.benchmarking.power import (
    Run,
    goal_power,
    pairs_needed,
    reach_budget,
    reach_share,
    simulated_power,
)
from scripts.benchmarking.quality import Censored

ROOT = Path(__file__).resolve().parents[2]
ALIKE = [Run([(10.0, 0.5), (40.0, 0.4)], 100.0)] * 3  # each run at 0.5 by 10 s, 0.4 by 40 s


def test_every_study_alike_gives_power_zero_or_one_by_the_exact_tests() -> None:
    """Ours 2x faster on identical curves wins every pair: at 10 pairs both one-sided
    p-values are 1/1024 (two-sided 2/1024: shown in every study); at 5 pairs the smallest
    two-sided p is 2/32 = 0.0625 (never shown), whatever the speedup."""
    assert simulated_power(ALIKE, [0.5], 10, 100.0, 2.0, studies=20) == 1.0
    assert simulated_power(ALIKE, [0.5], 5, 100.0, 10.0, studies=20) == 0.0
    # equal contenders, "no slower than 1.1x": every pair a tie, within the margin
    assert simulated_power(ALIKE, [0.5, 0.4], 10, 100.0, 1.0, margin=1.1, studies=20) == 1.0
    assert simulated_power(ALIKE, [0.5], 5, 100.0, 1.0, margin=1.1, studies=20) == 0.0
    # no speedup, no margin: nothing to find
    assert simulated_power(ALIKE, [0.5], 10, 100.0, 1.0, studies=20) == 0.0


def test_censored_runs_count_against_ours_and_short_runs_are_not_drawn() -> None:
    # a target the runs never reach: ours censored in every pair, so never shown faster
    assert simulated_power(ALIKE, [0.1], 10, 100.0, 10.0, studies=20) == 0.0
    # at a 30 s budget the 0.4 target (40 s; 20 s for ours 2x faster) is censored for the
    # baseline only: every pair still a win, with its bound
    assert simulated_power(ALIKE, [0.4], 10, 30.0, 2.0, studies=20) == 1.0
    # ... and at 15 s ours (at 20 s) is censored too
    assert simulated_power(ALIKE, [0.4], 10, 15.0, 2.0, studies=20) == 0.0
    # no kept run lasted 200 s: no estimate rather than one from curves cut short
    assert simulated_power(ALIKE, [0.5], 10, 200.0, 2.0, studies=20) is None
    # every target must be shown: one target never reached fails the study
    assert simulated_power(ALIKE, [0.5, 0.1], 10, 100.0, 2.0, studies=20) == 0.0


def test_goal_power_reads_the_goal_kind() -> None:
    assert goal_power(ALIKE, [0.5], 10, 100.0, 2.0, None, studies=20) == 1.0  # speedup goal
    assert goal_power(ALIKE, [0.5], 10, 100.0, None, 1.1, studies=20) == 1.0  # no slower


def test_pairs_needed_is_the_fewest_with_enough_power() -> None:
    assert pairs_needed({5: 0.1, 10: 0.85, 20: 0.99}) == 10
    assert pairs_needed({5: 0.1, 10: 0.5}) is None
    assert pairs_needed({5: None, 10: 0.8}) == 10


def test_kaplan_meier_share_at_the_target_by_hand() -> None:
    """Five runs: at 10 and 20 s, one censored at its 30 s budget, one at 40 s, one censored
    at 50 s. Reached by 10 s: 1/5; by 20 s: 1 - 4/5 * 3/4 = 0.4; the censored run leaves the
    risk set at 30 s (2 left); by 40 s: 1 - 0.6 * 1/2 = 0.7. 80 % is never reached."""
    times = [Censored(10, False), Censored(20, False), Censored(30, True), Censored(40, False),
             Censored(50, True)]
    got = reach_share(times)
    assert [t for t, _ in got] == [10, 20, 40]
    assert [s for _, s in got] == pytest.approx([0.2, 0.4, 0.7])
    assert reach_budget(times, 0.7) == 40
    assert reach_budget(times, 0.4) == 20
    assert reach_budget(times, 0.8) is None
    # a run reaching the target at the very time another is censored counts as reached first
    assert reach_share([Censored(30, True), Censored(30, False)]) == [(30, 0.5)]


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/bench_power.py", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_the_tool_on_the_kept_cpu_curves() -> None:
    """The kept expert CPU baseline: 6 of its 10 runs of 120 s reach the 50 % target, so 80 %
    of runs at the target is beyond the kept curves; its 10 % target by 21 s."""
    done = _tool("docs/quality-data/cpu-expert", "--workload", "a", "--group",
                 "pair:ours+optuna-cpu-t1-none", "--contender", "optuna-cpu-t1-none",
                 "--pairs", "5,10", "--studies", "20")
    assert done.returncode == 0, done.stderr
    assert "10 kept curves of optuna-cpu-t1-none" in done.stdout
    assert "reached by 6 of them" in done.stdout
    assert "80% of the baseline's runs at the target: not within the kept runs (120 s)" in done.stdout
    assert "| 5 | 0% |" in done.stdout and "120 s: more than 10 pairs for 80% power" in done.stdout
    first = _tool("docs/quality-data/cpu-expert", "--group", "pair:ours+optuna-cpu-t1-none",
                  "--contender", "optuna-cpu-t1-none", "--target", "10%", "--pairs", "5",
                  "--studies", "5")
    assert "at the target: 21 s" in first.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--group", "pair:ours+optuna-cpu-t1-none", "--contender", "nobody"], "no runs of nobody"),
    (["--group", "pair:ours+optuna-cpu-t1-none", "--contender", "optuna-cpu-t1-none",
      "--target", "70%"], "no 70% target"),
    (["--group", "x", "--contender", "optuna-cpu-t1-none", "--pairs", "five"], "not numbers"),
    (["--group", "x", "--contender", "optuna-cpu-t1-none", "--margin", "0.9"], "--margin >= 1"),
])
def test_the_tool_refuses_bad_input_in_two_lines(args: list[str], says: str) -> None:
    done = _tool("docs/quality-data/cpu-expert", *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and says in lines[0]
    assert lines[1].startswith("hint: ")
