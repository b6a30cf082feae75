"""The time-to-quality benchmark's arithmetic (scripts/benchmarking/quality.py):
known answers worked out by hand (time to target, censoring, ratios, p-values, intervals)
and the coverage of every significance verdict by simulation. No study runs here."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scripts.benchmarking.quality import (
    Censored,
    best_so_far,
    compare,
    median_interval,
    median_time,
    quartile_band,
    sign_test,
    signed_rank_counts,
    signed_rank_test,
    targets_from_curve,
    time_to_target,
    two_sided,
    value_at,
)

CURVE = [(5.0, 0.50), (1.0, 0.60), (9.0, 0.45), (3.0, 0.70), (7.0, 0.48)]


def test_best_so_far_keeps_the_improvements_in_time_order() -> None:
    assert best_so_far(CURVE) == [(1.0, 0.60), (5.0, 0.50), (7.0, 0.48), (9.0, 0.45)]
    assert best_so_far([(2.0, 0.5), (2.0, 0.4)]) == [(2.0, 0.4)]  # a tie in time: the best
    assert best_so_far([]) == []


def test_value_at_is_a_step_function_inf_before_the_first_trial() -> None:
    assert value_at(CURVE, 0.5) == math.inf
    assert value_at(CURVE, 1.0) == 0.60  # completed at t counts at t
    assert value_at(CURVE, 6.9) == 0.50
    assert value_at(CURVE, 100.0) == 0.45


def test_targets_are_the_reference_values_at_10_50_100_percent_of_its_budget() -> None:
    assert targets_from_curve(CURVE, 10.0) == {"10%": 0.60, "50%": 0.50, "100%": 0.45}
    assert targets_from_curve(CURVE, 8.0) == {"10%": math.inf, "50%": 0.60, "100%": 0.48}


def test_time_to_target_with_ties_and_censoring() -> None:
    assert time_to_target(CURVE, 0.50, 10.0) == Censored(5.0, False)  # equal to the target: reached
    assert time_to_target(CURVE, 0.49, 10.0) == Censored(7.0, False)
    assert time_to_target(CURVE, 0.40, 10.0) == Censored(10.0, True)  # never: the budget, censored
    assert time_to_target(CURVE, 0.45, 8.0) == Censored(8.0, True)  # reached after the budget


def _runs(*times: float | str) -> list[Censored]:
    """Times in seconds; "300c": censored at a budget of 300 s."""
    return [Censored(float(str(t).rstrip("c")), str(t).endswith("c")) for t in times]


# Ten pairs without censoring or ties, speedups 3, 1.5, 2.5, 1.2, 0.8, 4, 1.6, 1.1, 5, 0.5.
# By hand: the median speedup is (1.5 + 1.6) / 2 = 1.55 (a swapped ratio gives 0.65). Ranked by
# |log speedup|: 1.1 (1), 1.2 (2), 0.8 (3, ours slower), 1.5 (4), 1.6 (5), 0.5 (6, slower),
# 2.5 (7), 3 (8), 4 (9), 5 (10): W+ = 55 - 3 - 6 = 46. P(W+ >= 46) = P(W- <= 9) = the subsets
# of 1..10 summing to at most 9 (partitions into distinct parts: 1 1 1 2 2 3 4 5 6 8 = 33)
# over 2^10. The other way W+ = 9: P(W >= 9) = 1 - 25 / 1024. Sign test: ours faster in 8 of
# 10: P(X >= 8) = (45 + 10 + 1) / 1024; the baseline in 2: P(X >= 2) = 1 - 11 / 1024.
TEN_OURS = _runs(10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
TEN_BASE = _runs(30, 30, 75, 48, 40, 240, 112, 88, 450, 50)


def test_known_answer_ten_pairs_ratio_p_values_and_interval() -> None:
    got = compare(TEN_OURS, TEN_BASE)
    assert got.median == pytest.approx(1.55)
    assert got.signed_rank_p_ours == pytest.approx(33 / 1024)
    assert got.signed_rank_p_baseline == pytest.approx(999 / 1024)
    assert got.signed_rank_p == pytest.approx(66 / 1024)  # two-sided: 0.064, not below 0.05
    assert got.sign_p_ours == pytest.approx(56 / 1024)
    assert got.sign_p_baseline == pytest.approx(1013 / 1024)
    assert got.sign_p == pytest.approx(112 / 1024)
    # ten pairs: k = 2, since P(X <= 1) = 11/1024 <= 0.025 < P(X <= 2) = 56/1024; the 2nd
    # smallest and 2nd largest speedups
    assert got.interval == pytest.approx((0.8, 4.0))
    assert (got.pairs, got.ours_censored, got.baseline_censored, got.both_censored) == (10, 0, 0, 0)
    assert got.faster() is None  # one-sided 0.032 is no two-sided 0.05
    # the same pairs from the baseline's side: every figure mirrored
    back = compare(TEN_BASE, TEN_OURS)
    assert back.median == pytest.approx((1 / 1.5 + 1 / 1.6) / 2)
    assert (back.signed_rank_p_ours, back.sign_p_ours) == pytest.approx((999 / 1024, 1013 / 1024))
    assert back.interval == pytest.approx((1 / 4.0, 1 / 0.8))


def test_known_answer_censored_pairs_count_against_the_side_a_test_favours() -> None:
    """Seven pairs at a budget of 300 s: ours faster in six (one of them against a censored
    baseline: speedup >= 10, its bound), both censored in the seventh. Dropping that pair
    would give sign p 1/64; counted as ours' loss, P(X >= 6 of 7) = 8/128. Signed ranks:
    the six wins take ranks 1-6 (speedups 1.5, 2.5, 3.5, 4, 4.5 and the bound 10), the
    unknown pair the largest, 7, against ours: W+ = 21, P(W- <= 7) = 19/128 (the subsets of
    1..7 summing to at most 7: 1 1 1 2 2 3 4 5)."""
    ours = _runs(10, 20, 30, 40, 50, 60, "300c")
    base = _runs(15, 50, "300c", 140, 200, 270, "300c")
    got = compare(ours, base)
    assert (got.ours_censored, got.baseline_censored, got.both_censored) == (0, 1, 1)
    assert got.median == pytest.approx(3.5)  # 1, 1.5, 2.5, 3.5, 4, 4.5, 10: the both-censored is 1
    assert got.sign_p_ours == pytest.approx(8 / 128)
    assert got.signed_rank_p_ours == pytest.approx(19 / 128)
    # the baseline's side: its censored run and the unknown pair are its losses; it won none
    assert got.sign_p_baseline == 1.0 and got.signed_rank_p_baseline == 1.0
    assert got.sign_p == pytest.approx(16 / 128) and got.signed_rank_p == pytest.approx(38 / 128)
    assert got.interval == (0.0, math.inf)  # 7 pairs: k = 1, and the bounds reach 0 and inf


def test_a_censored_baseline_counts_with_its_bound_and_censored_ours_as_the_largest_loss() -> None:
    """Six pairs at 100 s. For "ours faster": pair 2's baseline censored counts as speedup
    2 (100 / 50), the smallest it can be; pairs 3 (ours censored) and 4 (both) as losses
    larger than any other pair. |log| ranks: 0.75 (1, loss), 1.5 (2), 2 (3), 3 (4), the
    two losses (5, 6): W+ = 9, P(W >= 9 of n = 6) = 42/64. Sign: 3 wins of 6, 42/64."""
    ours = _runs(20, 50, "100c", "100c", 10, 80)
    base = _runs(60, "100c", 40, "100c", 15, 60)
    got = compare(ours, base)
    assert got.median == pytest.approx(1.25)  # 0.4, 0.75, 1, 1.5, 2, 3
    assert got.signed_rank_p_ours == pytest.approx(42 / 64)
    assert got.sign_p_ours == pytest.approx(42 / 64)
    # for "baseline faster" its censored run and the unknown pair are its losses: wins 0.4 (as
    # 100 / 40 the other way) and 0.75; W+ = 2 + 1 + 1 = 4 (Walsh averages), P(W >= 4) = 59/64
    assert got.signed_rank_p_baseline == pytest.approx(59 / 64)
    assert got.sign_p_baseline == pytest.approx(57 / 64)
    assert got.interval == (0.0, math.inf)
    assert (got.ours_censored, got.baseline_censored, got.both_censored) == (1, 1, 1)


def test_signed_rank_null_distribution_by_hand() -> None:
    assert signed_rank_counts(1) == (1, 1)
    assert signed_rank_counts(3) == (1, 1, 1, 2, 1, 1, 1)  # {}, {1}, {2}, {3} {1,2}, ...
    assert signed_rank_counts(4) == (1, 1, 1, 2, 2, 2, 2, 2, 1, 1, 1)
    for n in (5, 10, 25):
        counts = signed_rank_counts(n)
        assert sum(counts) == 2 ** n and len(counts) == n * (n + 1) // 2 + 1
        assert counts == counts[::-1]


def test_signed_rank_and_sign_tests_agree_with_scipy_without_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(11)
    for n in (4, 7, 12):
        ours = [Censored(float(t), False) for t in rng.lognormal(3.0, 0.5, size=n)]
        base = [Censored(float(t), False) for t in rng.lognormal(3.2, 0.5, size=n)]
        d = [math.log(b.seconds / o.seconds) for o, b in zip(ours, base, strict=True)]
        expected = stats.wilcoxon(d, alternative="greater", method="exact").pvalue
        assert signed_rank_test(ours, base) == pytest.approx(expected, rel=1e-9)
        wins = sum(x > 0 for x in d)
        assert sign_test(ours, base) == pytest.approx(
            stats.binomtest(wins, n, 0.5, alternative="greater").pvalue, rel=1e-9)


def test_two_sided_is_twice_the_smaller_side_at_most_one() -> None:
    assert two_sided(0.01, 0.995) == pytest.approx(0.02)
    assert two_sided(0.9, 0.2) == pytest.approx(0.4)
    assert two_sided(0.7, 0.6) == 1.0


def test_no_interval_from_five_pairs_and_from_six_the_extremes() -> None:
    """At 95 %: k = 0 for n = 5 (P(X = 0) = 1/32 > 0.025): no interval; n = 6: 1/64, k = 1."""
    five_o, five_b = _runs(10, 10, 10, 10, 10), _runs(20, 30, 40, 50, 60)
    assert median_interval(five_o, five_b) is None
    assert compare(five_o, five_b).interval is None
    six_o, six_b = _runs(10, 10, 10, 10, 10, 10), _runs(20, 30, 40, 50, 60, 5)
    assert median_interval(six_o, six_b) == pytest.approx((0.5, 6.0))
    assert median_interval(six_o, six_b, level=0.9) == pytest.approx((0.5, 6.0))


def test_identical_runs_are_no_difference_either_way() -> None:
    times = _runs(12, 30, 45, 50, 61, 70, 80, 90, 95, 99)
    got = compare(times, times)
    assert got.median == 1.0 and got.faster() is None
    # every difference is 0, a tie: no win for either side, so both one-sided p-values are 1
    assert got.sign_p_ours == got.sign_p_baseline == 1.0
    assert got.signed_rank_p_ours == got.signed_rank_p_baseline == 1.0


def test_one_tied_pair_stays_among_the_pairs_of_each_test() -> None:
    """Six pairs: one tie (30 s each), one small loss (speedup 0.9) and four wins (1.5, 2, 3,
    4). A tie is no win for either side and stays among the n pairs; the lenient textbook
    rule that drops it gives other, smaller p-values. Sign test, ours: 4 wins of 6, P(X >= 4)
    = (15 + 6 + 1)/64 (dropping the tie: 4 of 5, 6/32 = 12/64); the baseline: 1 win of 6,
    P(X >= 1) = 63/64 (dropped: 31/32). Signed rank, ours: the 21 Walsh averages less the
    three not above 0 (tie + tie, tie + loss, loss + loss) give W = 18, P(W >= 18 of 6) =
    (2 + 1 + 1 + 1)/64 (dropped: ranks 2-5 of 5, W+ = 14, P = 2/32 = 4/64)."""
    ours = _runs(30, 20, 20, 20, 20, 20)
    base = _runs(30, 18, 30, 40, 60, 80)
    got = compare(ours, base)
    assert got.sign_p_ours == pytest.approx(22 / 64)
    assert got.sign_p_baseline == pytest.approx(63 / 64)
    assert got.signed_rank_p_ours == pytest.approx(5 / 64)
    assert got.median == pytest.approx(1.75)  # 0.9, 1, 1.5, 2, 3, 4


def test_non_inferiority_known_answer_counts_censored_pairs_against_ours() -> None:
    """"Ours within 1.1x of the baseline's time" on log(1.1 * baseline / ours). Seven pairs:
    ours 1.05x slower in three (within the margin: wins), faster in two, 1.2x slower in one
    (a loss beyond the margin) and censored with the baseline in one (a loss, whatever the
    median makes of it). Sign: 5 wins of 7, P(X >= 5) = (21 + 7 + 1)/128. Signed rank on
    log(1.1 / 1.05) = 0.047 (x3), log(2.2) = 0.79, log(3.3) = 1.19, log(1.1 / 1.2) = -0.087,
    -inf: the Walsh averages above 0 are all 15 among the five wins and none with -inf; with
    -0.087 only those of 0.79 and 1.19 (2): W = 17, P(W >= 17 of 7) = 0.23 (18 of 128 sign
    patterns have W- <= 11, counted from the null distribution below)."""
    ours = _runs(21, 21, 21, 10, 10, 24, "99c")
    base = _runs(20, 20, 20, 20, 30, 20, "99c")
    got = compare(ours, base, margin=1.1)
    assert got.margin_sign_p == pytest.approx(29 / 128)
    counts = signed_rank_counts(7)
    assert got.margin_signed_rank_p == pytest.approx(sum(counts[17:]) / 128)
    assert not got.within_margin()
    # without the margin those three pairs are losses: 2 wins of 7
    assert got.sign_p_ours == pytest.approx(sum(math.comb(7, k) for k in range(2, 8)) / 128)
    # ten pairs each within the margin: 1/1024 by both tests, shown
    shown = compare(_runs(*[21] * 10), _runs(*[20] * 10), margin=1.1)
    assert shown.margin_sign_p == shown.margin_signed_rank_p == pytest.approx(1 / 1024)
    assert shown.within_margin() and shown.faster() == "baseline"
    # five pairs can never show it at one-sided 0.025 (the best is 1/32)
    assert not compare(_runs(*[10] * 5), _runs(*[20] * 5), margin=1.1).within_margin()


@pytest.mark.parametrize("n", [6, 10, 20])
@pytest.mark.parametrize("budget", [math.inf, 60.0])  # 60 s: about 40 % censored
def test_no_slower_holds_its_level_at_the_margin(n: int, budget: float) -> None:
    """A contender exactly 1.1x slower (the margin) is shown "within 1.1x" in at most 2.5 %
    of 2,000 simulated studies, the test's one-sided level; with censoring, fewer (measured:
    1.7 / 1.2 / 1.4 % without it, 0.6 / 0.2 / 0 % with it, at 6 / 10 / 20 pairs)."""
    rng = np.random.default_rng(3)
    shown = sum(compare(*_simulated(rng, n, 1 / 1.1, budget), margin=1.1).within_margin()
                for _ in range(2000))
    assert shown / 2000 <= 0.025


@pytest.mark.parametrize("n", [5, 10])
def test_a_contender_one_and_a_half_times_slower_fails_no_slower(n: int) -> None:
    """Issue 54: judged by the median, a contender truly 1.5x slower with about 40 % of the
    runs censored is "no slower" (median >= 1) in 40 % of these studies of 5 pairs and 27 %
    of 10, since a pair censored on both sides counts 1. The one-sided test at the 1.1x
    margin, censored pairs against ours, passes it in at most 2.5 % of 2,000 studies (here:
    none) and the goal is met in none. The price is power: at this censoring two equal
    contenders pass it in almost no study of 10 pairs; ours truly 2x faster in about 23 %."""
    from scripts.benchmarking.goals import GOALS, judge

    goal = GOALS["a-27"]
    reference = {"contender": "optuna-x", "seeds": 3, "seed_list": [101, 102, 103]}
    seeds = list(range(1, n + 1))
    rng = np.random.default_rng(54 + n)
    by_median = passed = met = censored = 0
    for _ in range(2000):
        ours, base = _simulated(rng, n, 1 / 1.5, 60.0)
        got = compare(ours, base, margin=goal.margin or 1.0)
        censored += sum(o.censored for o in ours) + sum(b.censored for b in base)
        by_median += got.median >= 1.0
        passed += got.within_margin()
        met += judge(goal, "optuna-nopruner", seeds, reference, {"50%": got}) == []
    assert 0.3 <= censored / (2000 * 2 * n) <= 0.5
    assert by_median / 2000 >= (0.4 if n == 5 else 0.2)  # what the median alone would say
    assert passed / 2000 <= 0.025 and met == 0
    if n == 10:  # not blind: ours truly 2x faster passes it in about a quarter of studies
        faster = sum(compare(*_simulated(rng, n, 2.0, 60.0), margin=1.1).within_margin()
                     for _ in range(500))
        assert faster / 500 >= 0.15


def test_unpaired_or_empty_input_is_refused() -> None:
    with pytest.raises(ValueError):
        compare(TEN_OURS, TEN_BASE[:9])
    with pytest.raises(ValueError):
        compare([], [])


def _simulated(rng: np.random.Generator, n: int, speedup: float,
               budget: float) -> tuple[list[Censored], list[Censored]]:
    """A study of n paired seeds: each seed's difficulty shared by both sides (a paired
    design), lognormal noise per run, ours ``speedup`` times faster, censored at ``budget``."""
    seed_effect = rng.lognormal(0.0, 0.5, size=n)
    base = 40.0 * seed_effect * rng.lognormal(0.0, 0.6, size=n)
    ours = 40.0 * seed_effect * rng.lognormal(0.0, 0.6, size=n) / speedup
    return ([Censored(min(t, budget), t > budget) for t in ours],
            [Censored(min(t, budget), t > budget) for t in base])


def _verdicts(ours: list[Censored], base: list[Censored]) -> dict[str, bool]:
    """Every "significant" a table can print, at 0.05 / 95 %."""
    got = compare(ours, base)
    return {"sign": got.sign_p < 0.05, "signed rank": got.signed_rank_p < 0.05,
            "interval": got.interval is not None and not got.interval[0] <= 1.0 <= got.interval[1],
            "faster": got.faster() is not None}


@pytest.mark.parametrize(("n", "configurations"), [(5, 100), (10, 4)])
@pytest.mark.parametrize("budget", [math.inf, 45.0])  # 45 s: about half the runs censored
def test_equal_contenders_are_called_different_in_at_most_5_percent_of_studies(
        n: int, configurations: int, budget: float) -> None:
    """Coverage, by simulation. Two equal contenders: any seed's two runs are equally likely
    to have come from either side, so each simulated set of n pairs stands for 2^n equally
    likely studies, its relabellings (ours and the baseline swapped in any subset of the
    pairs, censoring flags with them). Every verdict a table prints (a two-sided p-value
    below 0.05, an interval without 1, a side declared faster) must come out in at most 5 %
    of the relabellings of every set: 3,200 studies at n = 5 and 4,096 at n = 10, per
    budget, with no Monte Carlo error within a set. The percentile bootstrap used before
    called such contenders different in 6.0 % of 2,000 independent studies at n = 5, 5.6 %
    at n = 10 and 25 % at n = 3."""
    rng = np.random.default_rng(2024 + n)
    for _ in range(configurations):
        ours, base = _simulated(rng, n, 1.0, budget)
        called = dict.fromkeys(("sign", "signed rank", "interval", "faster"), 0)
        for mask in range(2 ** n):
            swap = [bool(mask >> i & 1) for i in range(n)]
            o = [b if s else a for a, b, s in zip(ours, base, swap, strict=True)]
            b = [a if s else b for a, b, s in zip(ours, base, swap, strict=True)]
            for name, significant in _verdicts(o, b).items():
                called[name] += significant
        for name, count in called.items():
            assert count / 2 ** n <= 0.05, (name, count, 2 ** n, ours, base)


def test_a_real_threefold_speedup_is_found_at_ten_pairs() -> None:
    """The tests are not blind: ours 3x faster, 10 pairs, about half the baseline's runs
    censored, 500 studies: found in 45 % of them (both tests must agree, and the sign test
    needs 9 wins of 10), never the other way round. Ten seeds detect only large effects."""
    rng = np.random.default_rng(7)
    found = sum(compare(*_simulated(rng, 10, 3.0, 45.0)).faster() == "ours" for _ in range(500))
    assert found / 500 >= 0.35
    backwards = sum(compare(*_simulated(rng, 10, 1 / 3.0, 45.0)).faster() == "ours"
                    for _ in range(500))
    assert backwards == 0


def test_median_time_is_a_lower_bound_once_half_the_runs_are_censored() -> None:
    assert median_time([Censored(3.0, False), Censored(5.0, False), Censored(9.0, True)]) == (5.0, False)
    assert median_time([Censored(3.0, False), Censored(9.0, True)]) == (6.0, True)
    assert median_time([Censored(9.0, True), Censored(9.0, True), Censored(2.0, False)]) == (9.0, True)


def test_quartile_band_counts_missing_runs_as_worse_and_leaves_gaps() -> None:
    runs = [[(1.0, 0.5), (3.0, 0.3)], [(2.0, 0.6)], [(4.0, 0.4)], [(1.0, 0.7)]]
    band = quartile_band(runs, [0.5, 1.0, 2.0, 5.0])
    assert np.isnan(band[:, 0]).all()  # no run has a trial yet
    # t=1: values 0.5, inf, inf, 0.7 -> q25 between 0.5 and 0.7; median and q75 need a missing run
    assert band[0, 1] == pytest.approx(0.65) and np.isnan(band[1, 1]) and np.isnan(band[2, 1])
    # t=5: 0.3, 0.6, 0.4, 0.7: linear quantiles
    assert list(band[:, 3]) == pytest.approx([0.375, 0.5, 0.625])
    assert np.isnan(quartile_band([], [1.0])).all()


# --- the launcher's plans and the results folder (scripts/bench_quality.py, tables.py) -----

def _script() -> Any:
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_quality.py"
    spec = importlib.util.spec_from_file_location("bench_quality", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_optuna_processes_get_a_gpu_each_and_disjoint_cores(tmp_path: object) -> None:
    from pathlib import Path

    bq = _script()
    work = bq.WORKLOADS["a"]
    half = bq.Half([2, 3], list(range(8)), "second half")
    plan = bq.launches("optuna-median", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert [p.gpus for p in plan] == [[2], [3]]
    assert [p.cores for p in plan] == [[0, 1, 2, 3], [4, 5, 6, 7]] and {p.threads for p in plan} == {4}
    assert all({"--pruner", "median", "--device", "gpu", "--seed", "7"} <= set(p.argv) for p in plan)
    cpu = bq.launches("optuna-cpu-t2", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert len(cpu) == 4 and all(p.gpus == [] and "cpu" in p.argv for p in cpu)
    assert sorted(c for p in cpu for c in p.cores) == list(range(8))
    ours = bq.launches("ours-median", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert len(ours) == 1 and ours[0].gpus == [2, 3] and ours[0].threads is None
    assert {"sampler.seed=7", "pruner=median"} <= set(ours[0].argv)
    # its defaults: every GPU of the half once (scheduler.parallel unset)
    assert not any(a.startswith("scheduler.parallel") for a in ours[0].argv)
    on_cpu = bq.launches("ours-cpu", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert [a for a in on_cpu[0].argv if a.startswith("objective.device")] == ["objective.device=cpu"]
    threads = bq.launches("optuna-threads", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert len(threads) == 1 and "--n-jobs" in threads[0].argv
    assert bq.parse_seeds("1-3,7") == [1, 2, 3, 7]
    assert bq.known("optuna-cpu-t16") and not bq.known("optuna-cpu-tx")
    cuda = bq.launches("optuna-nopruner", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"),
                       "cuda")
    assert all(p.argv[p.argv.index("--device") + 1] == "cuda" for p in cuda)
    mv = bq.launches("ours-mvtpe", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert {"sampler.multivariate=true", "sampler.constant_liar=true"} <= set(mv[0].argv)


def test_every_contender_of_ours_composes() -> None:
    """Each ``ours-*`` contender's overrides load as a configuration: a misspelt key would
    fail every run of it on the GPU host, after the device time was spent."""
    from hpo_orchestrator.config import load_config

    bq = _script()
    for name, overrides in bq.OURS.items():
        work = bq.WORKLOADS[bq.ONLY_ON.get(name, "a")]
        load_config([*work.overrides("auto"), *overrides])
    delay = load_config(bq.OURS["ours-delay"]).pruner
    assert (delay.patience_mode, delay.patience, delay.min_resource) == ("delay", 3, 3)


def test_the_best_trial_is_retrained_on_the_learner_it_used() -> None:
    bq = _script()
    cpu = ({"device_type": "cpu"}, None)
    cuda = ({"device_type": "cuda", "gpu_device_id": 0}, 2)  # the child sees the run's GPU 2 alone
    ours = {"contender": "ours", "gpus": [2, 3], "gpu_learner": "cuda"}
    effective = {"hpo.params_effective": {"device_type": "cuda", "num_leaves": 31}}
    assert bq.retrain_device(ours, effective) == cuda
    # ours' auto chose the CPU or OpenCL for that trial; or the trial recorded nothing
    for learner in ("cpu", "gpu"):
        assert bq.retrain_device(ours, {"hpo.params_effective": {"device_type": learner}}) == cpu
    assert bq.retrain_device(ours, {}) == cpu
    def optuna(name: str, gpus: list[int], learner: str = "cuda") -> dict[str, Any]:
        plan = bq.launches(name, bq.WORKLOADS["b"], 1.0, 7, 60.0, bq.Half(gpus, list(range(8)), "h"),
                           "sqlite:///x.db", Path("/tmp"), learner)
        return {"contender": name, "gpus": gpus, "gpu_learner": learner,
                "commands": [" ".join(one.argv[1:]) for one in plan]}

    assert bq.retrain_device(optuna("optuna-nopruner", [2, 3]), {}) == cuda
    # OpenCL, Optuna's CPU processes and a half without GPUs retrain on the CPU
    assert bq.retrain_device(optuna("optuna-nopruner", [2, 3], "gpu"), {}) == cpu
    assert bq.retrain_device(optuna("optuna-cpu-t8", [2, 3]), {}) == cpu
    assert bq.retrain_device(optuna("optuna-nopruner", []), {}) == cpu


def test_the_retraining_child_sees_only_the_runs_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    bq = _script()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)  # restored after the test
    bq._show_only(None)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    bq._show_only(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_optuna_workers_know_which_workloads_train_lightgbm() -> None:
    from scripts.benchmarking.optuna_worker import LIGHTGBM_WORKLOADS
    from scripts.benchmarking.workloads import WORKLOADS

    assert set(LIGHTGBM_WORKLOADS) == {n for n, w in WORKLOADS.items() if w.kind == "lightgbm"}


def test_store_replaces_a_rerun_seed_picks_the_best_baseline_and_writes_tables(
        tmp_path: object) -> None:
    from pathlib import Path

    from scripts.benchmarking.tables import Store

    out = Path(str(tmp_path))
    store = Store(out)
    meta = {"command": "c", "commit": "x", "machine": "m", "gpu_util_mean": 0.0, "pruned": 0,
            "test": None, "budget_s": 10.0}

    def run(name: str, seed: int, curve: list[tuple[float, float]], group: str = "solo") -> dict:
        return {**meta, "workload": "a", "group": group, "contender": name, "seed": seed,
                "curve": curve, "complete": len(curve), "best_value": min(v for _, v in curve)}

    # per baseline the median over its reference seeds at 10/50/100 % of 10 s: optuna-x's
    # seeds give (0.9, 0.5, 0.4), (0.8, 0.6, 0.3), (0.9, 0.7, 0.5) -> medians 0.9, 0.6, 0.4;
    # optuna-y's one seed 0.45 at 100 %: x is lower there, and the best
    store.add(run("optuna-x", 101, [(0.5, 0.9), (4.0, 0.5), (9.0, 0.4)], "reference"))
    store.add(run("optuna-x", 102, [(0.5, 0.8), (4.0, 0.6), (9.0, 0.3)], "reference"))
    store.add(run("optuna-x", 103, [(0.5, 0.9), (4.0, 0.7), (9.0, 0.5)], "reference"))
    store.add(run("optuna-y", 101, [(0.5, 0.8), (9.0, 0.45)], "reference"))
    entry = store.update_targets("a")
    assert entry["contender"] == "optuna-x" and entry["targets"] == {"10%": 0.9, "50%": 0.6, "100%": 0.4}
    assert entry["seed_list"] == [101, 102, 103] and entry["seeds"] == 3
    store.add(run("ours", 1, [(1.0, 0.3)]))
    store.add(run("ours", 1, [(2.0, 0.5)]))  # the same seed again: replaces
    store.add(run("optuna-x", 1, [(4.0, 0.5)]))
    assert len([r for r in Store(out).runs if r["contender"] == "ours"]) == 1
    store.write_report()
    text = (out / "results.md").read_text()
    assert "(seeds 101-103)" in text
    assert "| ours | 1 | 1 (0) | 0.50000 |" in text
    assert ">=10.0 (1 cens.)" in text  # neither reached 0.4: censored at the budget
    # 10 %: 4.0 / 2.0; one pair: no interval, one-sided p 1/2 each way -> two-sided 1
    assert "| ours | optuna-x | 1 | 2.00 [-], n=1; 0/0/0; p 1 / 1 |" in text
    assert (out / "curves-a-solo.png").exists()
    # an ablation pair (two of ours, no Optuna baseline): the variant against plain `ours`
    store.add(run("ours", 2, [(2.0, 0.5)], "pair:ours-median+ours"))
    store.add(run("ours-median", 2, [(1.0, 0.5)], "pair:ours-median+ours"))
    store.write_report()
    text = (out / "results.md").read_text()
    assert "| ours-median | ours | 2 | 2.00 [-], n=1; 0/0/0; p 1 / 1 |" in text
    # the package before an issue is the baseline: today's `ours` is measured against it
    store.add(run("ours", 3, [(2.0, 0.5)], "pair:ours+ours-before51"))
    store.add(run("ours-before51", 3, [(4.0, 0.5)], "pair:ours+ours-before51"))
    store.write_report()
    text = (out / "results.md").read_text()
    assert "| ours | ours-before51 | 3 | 2.00 [-], n=1; 0/0/0; p 1 / 1 |" in text


def test_a_comparison_is_refused_targets_of_few_or_repeated_reference_seeds() -> None:
    bq = _script()
    entry = {"contender": "optuna-x", "seeds": 3, "seed_list": [101, 102, 103]}
    assert bq.reference_refusal(entry, list(range(1, 11))) == ""
    assert "102" in bq.reference_refusal(entry, [5, 102])
    assert "1 reference seed" in bq.reference_refusal({**entry, "seed_list": [101]}, [1])
    both = bq.reference_refusal({**entry, "seeds": 1, "seed_list": [1]}, [1, 2])
    assert "1 reference seed" in both and "seeds [1] are the reference's own" in both
    # targets.json written before the seeds were recorded: their count alone says too little
    assert bq.reference_refusal({"contender": "optuna-x", "seeds": 3}, [1])


def test_optuna_baselines_by_name_threads_and_pruner() -> None:
    from scripts.benchmarking.optuna_worker import cpu_baseline, pruner_of

    assert cpu_baseline("optuna-cpu-t2") == (2, "median")  # the runs kept from before
    assert cpu_baseline("optuna-cpu-t1-median-tuned") == (1, "median-tuned")
    assert cpu_baseline("optuna-cpu-t16-none") == (16, "none")
    for bad in ("optuna-cpu-tx", "optuna-cpu-t0", "optuna-cpu-t1-fast", "optuna-median"):
        assert cpu_baseline(bad) is None
    assert pruner_of("optuna-hyperband-tuned") == "hyperband-tuned"
    assert pruner_of("optuna-nopruner") == "none" and pruner_of("ours") is None
    assert pruner_of("optuna-hyperband-tuned-x2") == "hyperband-tuned"
    bq = _script()
    half = bq.Half([], [4, 5, 6, 7], "first half")
    plan = bq.launches("optuna-cpu-t2-hyperband-tuned", bq.WORKLOADS["a"], 1.0, 3, 60.0, half,
                       "sqlite:///x.db", Path("/tmp"))
    assert [p.cores for p in plan] == [[4, 5], [6, 7]] and {p.threads for p in plan} == {2}
    assert all(p.argv[p.argv.index("--pruner") + 1] == "hyperband-tuned" for p in plan)
    gpu = bq.launches("optuna-median-tuned", bq.WORKLOADS["a"], 1.0, 3, 60.0,
                      bq.Half([0, 1], list(range(8)), "h"), "sqlite:///x.db", Path("/tmp"))
    assert [p.argv[p.argv.index("--pruner") + 1] for p in gpu] == ["median-tuned"] * 2


@pytest.mark.parametrize(("name", "reports", "expected"), [
    ("median", 20, ("MedianPruner", {"_n_startup_trials": 5, "_n_warmup_steps": 0})),
    ("median-tuned", 20, ("MedianPruner", {"_n_startup_trials": 10, "_n_warmup_steps": 6})),
    ("median-tuned", 10, ("MedianPruner", {"_n_startup_trials": 10, "_n_warmup_steps": 3})),
    ("hyperband", 20, ("HyperbandPruner", {"_min_resource": 1, "_reduction_factor": 3})),
    ("hyperband-tuned", 20, ("HyperbandPruner", {"_min_resource": 3, "_max_resource": 20,
                                                 "_reduction_factor": 3})),
    ("none", 20, ("NopPruner", {}))])
def test_the_baselines_pruners_as_configured(name: str, reports: int,
                                             expected: tuple[str, dict[str, int]]) -> None:
    """Optuna's defaults, and the settings an expert chooses for curves of 20 reports (10 for
    the CNN): the median waits for 10 finished trials and 30 % of the curve (never less than
    the product's 3 steps); Hyperband's brackets start at 3 reports, as the product's."""
    from scripts.benchmarking.optuna_worker import make_pruner

    pruner = make_pruner(name, reports)
    assert type(pruner).__name__ == expected[0]
    assert {k: getattr(pruner, k) for k in expected[1]} == expected[1]


class _RacedStudy:
    """A study whose optimize dies as Optuna's does when another process finished the same
    enqueued trial first, ``races`` times, advancing a fake clock by 10 s each time."""

    def __init__(self, races: int, error: str = "Cannot tell a COMPLETE trial.") -> None:
        self.races, self.error, self.now, self.timeouts = races, error, 0.0, []

    def optimize(self, objective: Any, timeout: float, n_jobs: int) -> None:
        self.timeouts.append(timeout)
        self.now += 10.0
        if self.races:
            self.races -= 1
            raise ValueError(self.error)


def test_an_optuna_baseline_goes_on_after_a_start_point_another_process_took() -> None:
    """Optuna's queue is not atomic on SQLite: a process that lost the race for a start point
    keeps optimizing to its timeout instead of dying (a baseline a process short)."""
    from scripts.benchmarking.optuna_worker import optimize_past_queue_races

    study = _RacedStudy(races=2)
    assert optimize_past_queue_races(study, None, 70.0, 1, clock=lambda: study.now) == 2
    assert study.timeouts == [70.0, 60.0, 50.0]  # the rest of the budget each time
    other = _RacedStudy(races=1, error="Cannot set the value of a parameter")
    with pytest.raises(ValueError, match="Cannot set"):  # any other error still ends it
        optimize_past_queue_races(other, None, 70.0, 1, clock=lambda: other.now)


def test_concurrent_seeds_get_disjoint_core_blocks_and_pairs_swap_halves() -> None:
    bq = _script()
    assert bq.seed_batches(["a", "b"], "a,b", 2) == [[("a", "first"), ("b", "second")]]
    assert bq.seed_batches(["a", "b"], "a,b", 3) == [[("a", "second"), ("b", "first")]]
    # alone: one after the other, the first place rotating with the seed (a cold host's first
    # run pays for the page cache)
    assert bq.seed_batches(["a", "b"], None, 2) == [[("a", "all")], [("b", "all")]]
    assert bq.seed_batches(["a", "b"], None, 1) == [[("b", "all")], [("a", "all")]]
    assert bq.seed_batches(["a", "b", "c"], None, 4) == [[("b", "all")], [("c", "all")],
                                                         [("a", "all")]]
    first, second = bq.half("first", [], [8, 9, 10, 11]), bq.half("second", [], [8, 9, 10, 11])
    assert (first.cores, second.cores, first.gpus) == ([8, 9], [10, 11], [])
    assert bq.half("second", [0, 1, 2, 3], [0, 1]).gpus == [2, 3]


_THREADS_RUN = """
import optuna
from scripts.benchmarking.workloads import WORKLOADS, lightgbm_objective
optuna.logging.set_verbosity(optuna.logging.WARNING)
cfg = WORKLOADS["a"].scaled(0.5).lightgbm
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0),
                            pruner=optuna.pruners.NopPruner())
study.optimize(lightgbm_objective(cfg, {"device_type": "cpu"}, 1), n_trials=12, n_jobs=4)
print(sorted({t.state.name for t in study.trials}))
"""


def test_optuna_threads_share_the_kept_cpu_datasets_without_a_crash() -> None:
    """optuna-threads runs trials in threads of one process: the Datasets every trial reuses
    are binned before the first one, not by whichever thread trains first (it crashed)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _THREADS_RUN], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['COMPLETE']"


@pytest.mark.parametrize(("device", "threaded", "kept"), [
    ("cpu", False, True), ("cpu", True, True), ("cuda", False, True),
    ("cuda", True, False), ("gpu", False, False)])
def test_optuna_processes_keep_the_datasets_ours_keep(device: str, threaded: bool, kept: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna's processes bin once where ours do (CPU and CUDA learners: objectives/lightgbm.py),
    so a comparison is not won by binning; threads of one process share the CPU's only."""
    from scripts.benchmarking import workloads

    built: list[object] = []
    monkeypatch.setattr(workloads, "_datasets",
                        lambda cfg, kept_for=None: built.append(kept_for) or ("train", "valid"))
    workloads.lightgbm_objective(workloads.WORKLOADS["a"].lightgbm, {"device_type": device}, 2,
                                 threaded=threaded)
    assert (len(built) == 1 and built[0]["device_type"] == device) is kept  # type: ignore[index]
    assert len(built) == (1 if kept else 0)


def test_goals_are_met_only_with_enough_pairs_an_expert_baseline_and_clean_targets() -> None:
    """Ten pairs, ours 2x faster in each (sign p 2/1024, signed-rank p 2/1024): the CPU goal
    (0.8x, 10 pairs) is met against a tuned baseline whose targets came from 3 other seeds;
    each missing piece of evidence is named, and 1.2x is below the goal's 1.25."""
    from scripts.benchmarking.goals import GOALS, judge

    goal = GOALS["a-cpu"]
    seeds = list(range(1, 11))
    reference = {"contender": "optuna-cpu-t1-none", "seeds": 3, "seed_list": [101, 102, 103]}
    twice = {"50%": compare(_runs(*range(10, 110, 10)), _runs(*range(20, 220, 20)))}
    assert twice["50%"].sign_p == pytest.approx(2 / 1024)
    assert judge(goal, "optuna-cpu-t1-none", seeds, reference, twice) == []
    assert judge(goal, "optuna-cpu-t1-none", seeds[:9], reference, twice) == [
        "9 paired seeds, 10 needed"]
    assert judge(goal, "optuna-cpu-t2", seeds, reference, twice) == [
        "optuna-cpu-t2 prunes at Optuna's defaults (median)"]
    assert judge(goal, "ray-asha", seeds, reference, twice) == ["ray-asha is no Optuna baseline"]
    # a goal against the documented recipe takes Optuna's defaults as they are, not other tools
    recipe = replace(goal, against="recipe")
    assert judge(recipe, "optuna-cpu-t2", seeds, reference, twice) == []
    assert judge(recipe, "ray-asha", seeds, reference, twice) == ["ray-asha is no Optuna baseline"]
    # and one against the package before an issue, that package only
    before = replace(goal, against="before")
    assert judge(before, "ours-before51", seeds, reference, twice) == []
    assert judge(before, "optuna-cpu-t1-none", seeds, reference, twice) == [
        "optuna-cpu-t1-none is not the package as it was before (ours-before*)"]
    assert judge(goal, "optuna-cpu-t1-none", seeds, {**reference, "seed_list": [1, 2, 3]},
                 twice) == ["reference seeds 1-3 repeated in the comparison"]
    assert judge(goal, "optuna-cpu-t1-none", seeds, {"contender": "x", "seeds": 1},
                 twice) == ["targets from 1 reference seed(s), 3 needed", "reference seeds not recorded"]
    # the overlap is checked at any count of reference seeds, and rebuilt targets are named
    assert judge(goal, "optuna-cpu-t1-none", seeds, {"contender": "x", "seed_list": [1]},
                 twice) == ["targets from 1 reference seed(s), 3 needed",
                            "reference seeds 1 repeated in the comparison"]
    assert judge(goal, "optuna-cpu-t1-none", seeds, {**reference, "rebuilt": True}, twice) == [
        "targets rebuilt from printed figures (the reference's raw results not kept)"]
    slight = {"50%": compare(_runs(*range(10, 110, 10)), _runs(*range(12, 132, 12)))}
    assert judge(goal, "optuna-cpu-t1-none", seeds, reference, slight) == [
        "50%: median 1.20 < 1.25"]
    # "no slower" (within 1.1x): the baseline 2x faster fails it; ten ties pass it (each pair
    # within the margin: 1/1024 one-sided), and a median of 1 from censored pairs does not
    gpu = GOALS["a-gpu"]
    backwards = {k: compare(_runs(*range(20, 220, 20)), _runs(*range(10, 110, 10)), margin=1.1)
                 for k in gpu.targets}
    assert judge(gpu, "optuna-nopruner", seeds, reference, backwards) == [
        f"{k}: the baseline significantly faster, not shown within 1.1x (one-sided p 1 / 1, "
        "0.025 needed)" for k in gpu.targets]
    level = {k: compare(TEN_OURS, TEN_OURS, margin=1.1) for k in gpu.targets}
    assert judge(gpu, "optuna-nopruner", seeds, reference, level) == []
    censored = {k: compare(_runs(*[10] * 4, *["99c"] * 6), _runs(*[10] * 4, *["99c"] * 6),
                           margin=1.1) for k in gpu.targets}
    assert censored["50%"].median == 1.0  # four ties and six pairs censored on both sides
    # the ties are wins within the margin, the censored pairs losses: sign P(X >= 4 of 10) =
    # 848/1024; signed rank: W = the 10 Walsh averages of the four wins, P(W >= 10 of 10)
    assert censored["50%"].margin_sign_p == pytest.approx(848 / 1024)
    assert judge(gpu, "optuna-nopruner", seeds, reference, censored) == [
        f"{k}: not shown within 1.1x (one-sided p 0.83 / 0.97, 0.025 needed)" for k in gpu.targets]


def test_a_run_counts_only_trials_that_ended_within_its_budget(tmp_path: Path) -> None:
    """A contender is stopped at the budget, but its processes may finish a trial while they
    stop (up to 15 s): such a trial is no part of its curve, counts or best value. Launch at
    L, budget 10 s: trials ending at L+2 (COMPLETE 0.5), L+5 (PRUNED) and L+12 (COMPLETE 0.1)
    give a curve of one point, 1 complete, 1 pruned, best 0.5."""
    from datetime import datetime, timedelta
    from types import SimpleNamespace

    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    bq = _script()
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="bench", storage=url)
    launch = datetime(2026, 1, 1, 12, 0, 0)
    for seconds, state, value in ((2, TrialState.COMPLETE, 0.5), (5, TrialState.PRUNED, None),
                                  (12, TrialState.COMPLETE, 0.1)):
        trial = create_trial(state=state, value=value, params={"x": 0.5},
                             distributions={"x": FloatDistribution(0, 1)},
                             intermediate_values={1: 0.9})
        trial.datetime_start = launch
        trial.datetime_complete = launch + timedelta(seconds=seconds)
        study.add_trial(trial)
    watch = SimpleNamespace(mean=lambda gpus, lo, hi: {}, trace=lambda gpus, lo, hi: [])
    run = bq.collect({"contender": "optuna-x", "launch": launch.timestamp(), "budget_s": 10.0,
                      "url": url, "gpus": [], "commands": ["x"]}, watch, with_test=False, threads=1)
    assert run["curve"] == [(2.0, 0.5)]
    assert (run["complete"], run["pruned"], run["best_value"]) == (1, 1, 0.5)


def test_stopping_a_run_records_a_process_that_failed_before_the_budget() -> None:
    """At the budget every process group gets SIGTERM; a process that had already exited
    with an error is recorded (a baseline short of a process is no fair contender), and what
    a process started in its group goes with it."""
    import subprocess
    import sys
    import time

    import psutil

    bq = _script()
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    working = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    failed.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not psutil.Process(working.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = psutil.Process(working.pid).children()
    run = {"procs": [failed, working]}
    bq.stop(run)
    assert run["early_failures"] == [3]
    assert run["exit_codes"] == [3, -15]
    child.wait(timeout=10)  # SIGTERM reached the whole group


@pytest.mark.parametrize(("prune_at", "state"), [(19, "PRUNED"), (20, "COMPLETE")])
def test_optuna_processes_never_prune_at_the_last_report(prune_at: int, state: str) -> None:
    """The baselines' objective reports every 10 of 200 rounds (steps 1-20) and, as the
    product's (objectives/lightgbm.py), asks the pruner at every step but the last: a trial
    that reached its last report is complete, whatever the pruner says."""
    import optuna

    from scripts.benchmarking.workloads import WORKLOADS, lightgbm_objective

    class PruneAt(optuna.pruners.BasePruner):
        def prune(self, study: Any, trial: Any) -> bool:
            return trial.last_step == prune_at

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=PruneAt(), sampler=optuna.samplers.RandomSampler(seed=0))
    objective = lightgbm_objective(WORKLOADS["a"].scaled(0.05).lightgbm, {"device_type": "cpu"}, 1)
    study.optimize(objective, n_trials=1)
    assert study.trials[0].state.name == state
    assert max(study.trials[0].intermediate_values) == prune_at


def test_the_gpu_watch_reads_busy_after_the_first_seconds_and_keeps_its_trace() -> None:
    """Issue 51's goal is the GPU's busy share after a run's first 20 s: a run that ramps up
    reads lower from launch than after 20 s, and the trace keeps every reading of the run's
    own GPUs (seconds from launch first) for any other window."""
    bq = _script()
    watch = object.__new__(bq.GpuWatch)
    launch = 1000.0
    watch.samples = [(launch + t, {0: 10.0 if t < 20 else 90.0, 1: 50.0}) for t in range(0, 70, 5)]
    run = bq.collect({"contender": "ours", "launch": launch, "budget_s": 70.0,
                      "url": "sqlite:///:memory:", "gpus": [0], "commands": ["x"]},
                     watch, with_test=False, threads=1)
    assert run["gpu_util_after_20s"] == 90.0
    assert run["gpu_util_mean"] < 90.0
    assert run["gpu_trace"][0] == [0.0, 10.0] and run["gpu_trace"][-1] == [65.0, 90.0]


def test_the_package_before_an_issue_runs_as_ours_from_its_own_tree(tmp_path: Path) -> None:
    """``ours-before51`` is ``ours`` with every default of 8ff90f4: the same command, the old
    package imported ahead of today's, and a clear refusal where its tree was not made."""
    import subprocess
    import sys

    bq = _script()
    half = bq.Half([], [0, 1], "all")
    work = bq.WORKLOADS["a"]
    args = (work, 1.0, 7, 60.0, half, "sqlite:///x.db", tmp_path)
    before, = bq.launches("ours-before51", *args)
    today, = bq.launches("ours", *args)
    assert before.argv == today.argv and today.tree is None
    assert before.tree == bq.TREES / "8ff90f4" and bq.known("ours-before51")
    # a stand-in for the old tree: the child imports it, not today's package
    old = tmp_path / "tree"
    (old / "hpo_orchestrator").mkdir(parents=True)
    (old / "hpo_orchestrator" / "__init__.py").write_text("MARK = 'then'\n")
    env = bq.process_env(bq.Launch(before.argv, [], [0], tree=old), {"PYTHONPATH": str(bq.ROOT)})
    seen = subprocess.run([sys.executable, "-c", "import hpo_orchestrator as h; print(h.MARK)"],
                          env=env, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert seen.stdout.strip() == "then" and env["CUDA_VISIBLE_DEVICES"] == ""
    refused = subprocess.run(
        [sys.executable, str(bq.ROOT / "scripts" / "bench_quality.py"), "--out", str(tmp_path / "o"),
         "--workload", "a", "--pair", "ours,ours-before51", "--seeds", "1", "--no-gpu"],
        env={**env, "PYTHONPATH": str(bq.ROOT), "HPO_BENCH_TREES": str(tmp_path / "none")},
        capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "o" / "results.json").exists()
    assert refused.stderr.startswith(f"error: no source tree of 8ff90f4 in {tmp_path / 'none'}")
    assert "--make-trees" in refused.stderr


def test_the_torch_mlp_workload_runs_the_built_in_objective_for_ours_only(tmp_path: Path) -> None:
    """Workload (t) is ``objective=torch_mlp`` at its defaults: its common start points are
    exactly the params the objective suggests (batch_size too), so an enqueued point is the
    trial that runs; Optuna's processes have no such objective and are refused."""
    import subprocess
    import sys

    import optuna

    from hpo_orchestrator.config import load_config
    from hpo_orchestrator.objectives.torch_mlp import TorchMLPObjective

    bq = _script()
    work = bq.WORKLOADS["t"]
    assert work.overrides("auto") == ["objective=torch_mlp"]
    points = bq.start_points(work, 3, 4)
    assert points == bq.start_points(work, 3, 4) and len({str(p) for p in points}) == 4
    objective = TorchMLPObjective(load_config(work.overrides("auto")).objective)  # type: ignore[arg-type]
    study = optuna.create_study()
    asked = study.ask()
    objective._loader_options(asked)
    from hpo_orchestrator.objectives import suggest_all

    suggest_all(asked, objective.space)
    assert set(points[0]) == set(asked.params)
    refused = subprocess.run(
        [sys.executable, str(bq.ROOT / "scripts" / "bench_quality.py"), "--out", str(tmp_path),
         "--workload", "t", "--pair", "ours,optuna-hyperband", "--seeds", "1"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(bq.ROOT)})
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: workload t (the built-in torch_mlp) runs ours' "
                                     "contenders only, not optuna-hyperband")


def test_a_contender_of_one_workload_is_refused_on_another(tmp_path: Path) -> None:
    """``ours-setup`` names the CNN's setup hook: on LightGBM's workload it would fail every
    run on the GPU host; it is refused here, before any run."""
    import subprocess
    import sys

    bq = _script()
    refused = subprocess.run(
        [sys.executable, str(bq.ROOT / "scripts" / "bench_quality.py"), "--out", str(tmp_path),
         "--workload", "a", "--pair", "ours-setup,ours", "--seeds", "1"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(bq.ROOT)})
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ours-setup run(s) on workload c only, not a")


def test_targets_judge_only_runs_on_their_reference_set_up(tmp_path: Path) -> None:
    """A reference's targets say what its runs' GPUs and cores reach in the budget: targets.json
    records that set-up, and a comparison that gives each contender another is refused (the
    torch_mlp reference on 8 cores a run set a target no run on 2 reached)."""
    import json
    import subprocess
    import sys

    from scripts.benchmarking.tables import Store

    bq = _script()
    store = Store(tmp_path)
    for seed in (101, 102, 103):
        store.add({"workload": "a", "group": "reference", "contender": "optuna-x", "seed": seed,
                   "curve": [(1.0, 0.5)], "budget_s": 10.0, "gpus": [], "cores": [0, 1]})
    store.add({"workload": "a", "group": "reference", "contender": "optuna-y", "seed": 101,
               "curve": [(1.0, 0.9)], "budget_s": 10.0, "gpus": [0], "cores": list(range(8))})
    entry = store.update_targets("a")
    assert entry["contender"] == "optuna-x" and entry["setup"] == [{"gpus": 0, "cores": 2}]
    assert bq.setup_refusal(entry, 0, 2) == ""
    assert bq.setup_refusal({k: v for k, v in entry.items() if k != "setup"}, 0, 8) == ""
    assert bq.setup_refusal(entry, 0, 4) == ("the targets come from reference runs of 0 GPU(s) "
                                             "and 2 cores each; this comparison gives each "
                                             "contender 0 GPU(s) and 4 cores")
    assert "1 GPU(s) and 2 cores" in bq.setup_refusal(entry, 1, 2)
    # pair mode halves the block: 2 cores give each contender 1, not the reference's 2
    refused = subprocess.run(
        [sys.executable, str(bq.ROOT / "scripts" / "bench_quality.py"), "--out", str(tmp_path),
         "--workload", "a", "--seeds", "1", "--no-gpu", "--cpus", "0-1",
         "--pair", "ours-hyperband,ours"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(bq.ROOT)})
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("error: the targets come from reference runs of 0 GPU(s) "
                                     "and 2 cores each; this comparison gives each contender "
                                     "0 GPU(s) and 1 cores")
    assert "hint: run --reference on the comparison's set-up" in refused.stderr
    assert json.loads((tmp_path / "results.json").read_text())["runs"][-1]["group"] == "reference"


def test_a_pair_on_an_odd_split_is_refused_for_either_half(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Pair mode on 5 cores gives one contender 2 and the other 3 (swapped by seed): both must
    have the reference's set-up, not only the first half."""
    import sys

    from scripts.benchmarking.tables import Store

    bq = _script()
    store = Store(tmp_path)
    for seed in (101, 102, 103):
        store.add({"workload": "a", "group": "reference", "contender": "optuna-x", "seed": seed,
                   "curve": [(1.0, 0.5)], "budget_s": 10.0, "gpus": [], "cores": [0, 1]})
    assert store.update_targets("a")["setup"] == [{"gpus": 0, "cores": 2}]

    def ran(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a run started on a set-up the targets cannot judge")

    monkeypatch.setattr(bq, "start", ran)
    monkeypatch.setenv("HPO_QUALITY_SCALE", "1")  # main sets it; restored after the test
    monkeypatch.setattr(sys, "argv", ["bench_quality.py", "--out", str(tmp_path), "--workload",
                                      "a", "--seeds", "1", "--no-gpu", "--cpus", "0-4",
                                      "--pair", "ours-hyperband,ours"])
    assert bq.main() == 2


def test_targets_from_kept_runs_record_their_source_set_up_and_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--targets-from takes a baseline's runs of a kept comparison as the reference: its
    targets, set-up and seeds as --reference would write them, a note naming the source (the
    report's header shows it), and fewer than 3 seeds, a seed twice (two groups: the error
    names them, --targets-group picks one) or two budgets refused, nothing written; with
    --pair it is refused whole."""
    import sys

    from scripts.benchmarking.tables import Store

    bq = _script()
    kept = Store(tmp_path / "kept")
    kept.out.mkdir()
    for seed, value in ((17, 0.5), (18, 0.7), (19, 0.6), (11, 0.1)):
        kept.add({"workload": "c", "group": "pair:ours+x:start10", "contender": "x", "seed": seed,
                  "curve": [(2.0, value + 0.1), (6.0, value)], "budget_s": 10.0,
                  "gpus": [1], "cores": list(range(16))})
        kept.add({"workload": "c", "group": "pair:ours+x:start10", "contender": "ours",
                  "seed": seed, "curve": [(1.0, 0.0)], "budget_s": 10.0})
    out = Store(tmp_path / "new")
    out.out.mkdir()
    assert bq.targets_from(out, kept.out, "c", "x", [17, 18]) == 2
    assert out.targets() == {}
    assert bq.targets_from(out, kept.out, "c", "x", [17, 18, 19]) == 0
    entry = out.targets()["c"]
    assert entry["contender"] == "x" and entry["seed_list"] == [17, 18, 19]
    assert entry["targets"] == {"10%": math.inf, "50%": 0.7, "100%": 0.6}
    assert entry["setup"] == [{"gpus": 1, "cores": 16}]
    assert "kept's runs of x, seeds [17, 18, 19], group pair:ours+x:start10" in entry["note"]
    assert bq.reference_refusal(entry, [11, 12, 13]) == ""
    meta = {"command": "c", "commit": "x", "machine": "m", "gpu_util_mean": 0.0, "pruned": 0,
            "test": None, "complete": 1, "best_value": 0.5}
    for run in kept.runs:  # a comparison judged by them: its report's header names them
        out.add({**meta, **run})
    assert "Targets (logloss): 10% inf, 50% 0.70000, 100% 0.60000 (from " in \
        "\n".join(out.section("c", "pair:ours+x:start10", plot=False))
    # the same seeds in a second group, then at a second budget
    for seed in (17, 18, 19):
        kept.add({"workload": "c", "group": "solo", "contender": "x", "seed": seed,
                  "curve": [(2.0, 0.9)], "budget_s": 10.0, "gpus": [1], "cores": list(range(16))})
    again = Store(tmp_path / "again")
    again.out.mkdir()
    capsys.readouterr()
    assert bq.targets_from(again, kept.out, "c", "x", [17, 18, 19]) == 2
    assert "in group(s) pair:ours+x:start10, solo" in capsys.readouterr().err
    assert again.targets() == {}
    assert bq.targets_from(again, kept.out, "c", "x", [17, 18, 19], "solo") == 0
    assert again.targets()["c"]["targets"]["100%"] == 0.9
    kept.add({"workload": "c", "group": "solo", "contender": "x", "seed": 20,
              "curve": [(2.0, 0.9)], "budget_s": 20.0, "gpus": [1], "cores": list(range(16))})
    assert bq.targets_from(again, kept.out, "c", "x", [18, 19, 20], "solo") == 2
    monkeypatch.setattr(sys, "argv", ["bench_quality.py", "--out", str(again.out), "--workload",
                                      "c", "--seeds", "17-19", "--targets-from", str(kept.out),
                                      "--pair", "ours,x"])
    assert bq.main() == 2 and "it runs nothing" in capsys.readouterr().err
