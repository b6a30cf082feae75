"""The arithmetic of the time-to-quality benchmark: pure functions of curves and numbers.

A *curve* is a run's trials as ``(seconds since the contender's launch, value)`` for every
COMPLETE trial, in any order; all values are minimized. Its best-so-far is a step function:
+inf until the first trial completes.

Censoring: a run that never reaches a target within its budget gets ``time = budget`` and a
``censored`` flag; it is kept, never dropped (dropping the slow runs would flatter the
slower contender). In a paired ratio ``baseline / ours`` (a speedup, > 1: ours is faster), a
censored ``ours`` makes the ratio an upper bound, a censored baseline a lower bound; the
median ratio, a point estimate, counts a pair with both censored as 1, and the tables count
each kind.

Significance: an exact sign test and an exact Wilcoxon signed-rank test on the log speedups
of the paired seeds, each one-sided and computed for both directions, and a distribution-free
interval for the median speedup (the sign test inverted). A pair whose order a test cannot
know counts against the side that test would favour: for "ours is faster", ours censored or
both censored is a loss of the largest rank, a censored baseline counts with its bound. So a
censored study can only make the p-values larger. Two equal contenders are called different
(two-sided p < 0.05, or an interval that excludes 1) in at most 5 % of studies at any number
of pairs (tests/scripts/test_bench_quality.py simulates it); where five pairs cannot give a 95 %
interval, none is shown. There is no bootstrap: a percentile bootstrap of the median calls
equal contenders different in about 6 % of studies of 5 or 10 pairs and 25 % of 3.

"No slower" is a test too (non-inferiority): the same two tests, one-sided, on
``log(margin * baseline / ours)``: ours is shown within ``margin`` of the baseline only where
both are below 0.025, censored pairs again against ours. The median alone cannot show it:
pairs censored on both sides count 1 there, so a contender 1.5x slower with about 40 % of its
runs censored shows a median of at least 1 in about half of the studies of 5 pairs, and passes
this test in none (tests/scripts/test_bench_quality.py).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MARGIN_ALPHA", "Censored", "PairedComparison", "best_so_far", "compare",
           "median_interval", "median_time", "quartile_band", "sign_test", "signed_rank_counts",
           "signed_rank_test", "targets_from_curve", "time_to_target", "two_sided", "value_at"]

Curve = Sequence[tuple[float, float]]
MARGIN_ALPHA = 0.025  # one-sided level of "within the margin": the two-sided 0.05's


def best_so_far(curve: Curve) -> list[tuple[float, float]]:
    """The points where the best value improves, in time order (ties in time: the best)."""
    out: list[tuple[float, float]] = []
    best = float("inf")
    for t, v in sorted(curve):
        if v < best:
            best = v
            out.append((float(t), float(v)))
    return out


def value_at(curve: Curve, t: float) -> float:
    """The best value completed at or before ``t`` seconds (+inf before the first)."""
    values = [v for s, v in curve if s <= t]
    return min(values) if values else float("inf")


def targets_from_curve(curve: Curve, budget_s: float,
                       fractions: Sequence[float] = (0.1, 0.5, 1.0)) -> dict[str, float]:
    """The values a reference run had reached at each fraction of its budget, keyed '10%' etc.
    A fraction before its first trial gives +inf (a target every run meets at once: say so
    rather than hide it; the caller warns)."""
    return {f"{round(f * 100)}%": value_at(curve, f * budget_s) for f in fractions}


@dataclass(frozen=True)
class Censored:
    """Time to a target: ``seconds``, or the budget with ``censored`` set when never reached."""

    seconds: float
    censored: bool


def time_to_target(curve: Curve, target: float, budget_s: float) -> Censored:
    """Seconds from launch until the first trial with value <= ``target`` completed (a tie
    with the target counts as reached); the budget, censored, when none did in time."""
    hits = [t for t, v in curve if v <= target and t <= budget_s]
    return Censored(min(hits), False) if hits else Censored(float(budget_s), True)


def _ratios(ours: Sequence[Censored], baseline: Sequence[Censored]) -> list[float]:
    return [1.0 if o.censored and b.censored else b.seconds / max(o.seconds, 1e-9)
            for o, b in zip(ours, baseline, strict=True)]


def _log_speedups(ours: Sequence[Censored], baseline: Sequence[Censored],
                  margin: float = 1.0) -> list[float]:
    """``log(margin * baseline / ours)`` per pair, each censored pair completed in the way
    least favourable to ours: ours censored (slower, by an unknown margin; or both censored,
    order unknown) -> -inf; the baseline alone censored -> its bound, log(margin * budget /
    ours), the smallest the true value can be. Every statistic below is non-decreasing in each
    value, so a test on these values is never more favourable to ours than on the true ones.
    ``margin`` > 1 tests "ours takes less than margin times the baseline's time" (a margin of
    non-inferiority) instead of "less than the baseline's"."""
    if len(ours) != len(baseline):
        raise ValueError(f"unpaired runs: {len(ours)} of ours, {len(baseline)} of the baseline")
    shift = math.log(margin)
    return [-math.inf if o.censored else
            math.log(max(b.seconds, 1e-9) / max(o.seconds, 1e-9)) + shift
            for o, b in zip(ours, baseline, strict=True)]


def _upper_tail(counts: Sequence[int], at_least: int) -> float:
    return sum(counts[max(at_least, 0):]) / sum(counts)


@functools.cache
def _binomial_counts(n: int) -> tuple[int, ...]:
    return tuple(math.comb(n, k) for k in range(n + 1))


@functools.cache
def signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2^n sign patterns of ranks 1..n give each rank sum W+ = 0 .. n(n+1)/2:
    the exact null distribution of Wilcoxon's signed-rank statistic without ties."""
    counts = [1]
    for rank in range(1, n + 1):
        longer = counts + [0] * rank
        for w, c in enumerate(counts):
            longer[w + rank] += c
        counts = longer
    return tuple(counts)


def sign_test(ours: Sequence[Censored], baseline: Sequence[Censored],
              margin: float = 1.0) -> float:
    """One-sided exact p-value that ours is faster (with ``margin``: that ours takes less than
    margin times the baseline's time): P(Binomial(n, 1/2) >= the pairs ours is known to have
    won). A tie, ours censored or both censored is no win, and stays among the n pairs."""
    d = _log_speedups(ours, baseline, margin)
    if not d:
        raise ValueError("no paired runs")
    return _upper_tail(_binomial_counts(len(d)), sum(x > 0 for x in d))


def signed_rank_test(ours: Sequence[Censored], baseline: Sequence[Censored],
                     margin: float = 1.0) -> float:
    """One-sided exact p-value of Wilcoxon's signed-rank test that ours is faster (with
    ``margin``, as :func:`sign_test`), on the log
    speedups. The statistic is the count of Walsh averages above 0, #{i <= j: d_i + d_j > 0}:
    without ties it is the rank sum of the positive differences, and it never decreases when
    a difference grows, so the least favourable completion of censored pairs and counting
    ties (zero, or a positive and a negative of one size) against ours keep the exact null
    distribution of n pairs an upper bound on the p-value. A tie stays among the n pairs (the
    lenient rule that drops it gives smaller p-values than the pairs support)."""
    d = _log_speedups(ours, baseline, margin)
    if not d:
        raise ValueError("no paired runs")
    w = sum(1 for i in range(len(d)) for j in range(i, len(d)) if d[i] + d[j] > 0)
    return _upper_tail(signed_rank_counts(len(d)), w)


def two_sided(p_ours: float, p_baseline: float) -> float:
    """Either side faster: twice the smaller one-sided p-value (Bonferroni over the two
    directions, each completed against its own claim), at most 1."""
    return min(1.0, 2.0 * min(p_ours, p_baseline))


def median_interval(ours: Sequence[Censored], baseline: Sequence[Censored],
                    level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median speedup, covering it with probability at
    least ``level``: the k-th smallest lower bound and the k-th largest upper bound of the
    pairs' ratios, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2 (the sign
    test inverted). A censored ratio's bounds: ours censored, (0, baseline / budget]; the
    baseline censored, [budget / ours, inf); both, (0, inf). None where no k >= 1 exists
    (n < 6 at 95 %): five pairs cannot bound a median at that level."""
    lows, highs = [], []
    for o, b in zip(ours, baseline, strict=True):
        ratio = b.seconds / max(o.seconds, 1e-9)
        lows.append(0.0 if o.censored else ratio)
        highs.append(math.inf if b.censored else ratio)
    n = len(lows)
    counts, tail, k = _binomial_counts(n), (1.0 - level) / 2.0, 0
    while k < n and sum(counts[:k + 1]) / 2 ** n <= tail:
        k += 1
    if k == 0:
        return None
    return sorted(lows)[k - 1], sorted(highs)[n - k]


@dataclass(frozen=True)
class PairedComparison:
    """Ours against a baseline over seeds paired by number, at one target: the median of
    ``baseline time / our time`` (> 1: ours faster; a both-censored pair counts 1), the
    interval of :func:`median_interval`, the censored pairs of each kind, and one-sided
    p-values in each direction (each completed against the side it would favour)."""

    median: float
    interval: tuple[float, float] | None
    pairs: int
    ours_censored: int  # ratio is an upper bound ("<=")
    baseline_censored: int  # ratio is a lower bound (">=")
    both_censored: int  # order unknown: against whichever side a test would favour
    sign_p_ours: float
    sign_p_baseline: float
    signed_rank_p_ours: float
    signed_rank_p_baseline: float
    margin: float = 1.0  # of non-inferiority: ours' time at most margin times the baseline's
    margin_sign_p: float = 1.0  # one-sided, that ours is within the margin (sign_test)
    margin_signed_rank_p: float = 1.0  # the same by signed_rank_test

    @property
    def sign_p(self) -> float:
        return two_sided(self.sign_p_ours, self.sign_p_baseline)

    @property
    def signed_rank_p(self) -> float:
        return two_sided(self.signed_rank_p_ours, self.signed_rank_p_baseline)

    def faster(self, alpha: float = 0.05) -> str | None:
        """"ours" or "baseline" where both two-sided tests are below ``alpha`` in that side's
        favour; None otherwise (no significant difference, or the tests disagree)."""
        if max(self.sign_p, self.signed_rank_p) >= alpha:
            return None
        if self.sign_p_ours < self.sign_p_baseline and \
                self.signed_rank_p_ours < self.signed_rank_p_baseline:
            return "ours"
        if self.sign_p_baseline < self.sign_p_ours and \
                self.signed_rank_p_baseline < self.signed_rank_p_ours:
            return "baseline"
        return None

    def within_margin(self, alpha: float = MARGIN_ALPHA) -> bool:
        """Ours shown no slower than ``margin`` times the baseline's time: both one-sided
        p-values below ``alpha``. One-sided 0.025 is the level of the two-sided 0.05 the
        tables use (the sign test's: the 95 % interval's lower bound above 1 / margin), so at
        least 6 pairs are needed (five wins of five: 1/32). Censored pairs count against
        ours, so a median that both-censored pairs pull to 1 proves nothing here."""
        return max(self.margin_sign_p, self.margin_signed_rank_p) < alpha


def compare(ours: Sequence[Censored], baseline: Sequence[Censored],
            level: float = 0.95, margin: float = 1.0) -> PairedComparison:
    """Every statistic the tables print for one pair of contenders at one target, and the
    one-sided tests that ours is within ``margin`` of the baseline (non-inferiority)."""
    ratios = _ratios(ours, baseline)
    if len(ratios) == 0:
        raise ValueError("no paired runs")
    flags = [(o.censored, b.censored) for o, b in zip(ours, baseline, strict=True)]
    return PairedComparison(
        median=statistics.median(ratios), interval=median_interval(ours, baseline, level),
        pairs=len(ratios), ours_censored=flags.count((True, False)),
        baseline_censored=flags.count((False, True)), both_censored=flags.count((True, True)),
        sign_p_ours=sign_test(ours, baseline), sign_p_baseline=sign_test(baseline, ours),
        signed_rank_p_ours=signed_rank_test(ours, baseline),
        signed_rank_p_baseline=signed_rank_test(baseline, ours), margin=margin,
        margin_sign_p=sign_test(ours, baseline, margin),
        margin_signed_rank_p=signed_rank_test(ours, baseline, margin))


def median_time(times: Sequence[Censored]) -> tuple[float, bool]:
    """The median time and whether it is only a lower bound (half or more runs censored:
    the median then lies at or beyond the budget)."""
    values = np.array([t.seconds for t in times])
    censored = sum(t.censored for t in times)
    return float(np.median(values)), censored * 2 >= len(times) and censored > 0


def quartile_band(curves: Sequence[Curve], grid: Sequence[float]) -> np.ndarray:
    """Rows q25, median, q75 of the runs' best-so-far at each grid time (shape 3 x len(grid)),
    numpy's linear quantiles. A run with no trial yet counts as worse than any value, so a
    quantile that depends on such a run (the median before half the runs have a result) is
    undefined and comes back as NaN: a gap in the plot, not a made-up value."""
    values = np.array([[value_at(c, t) for t in grid] for c in curves], dtype=float)
    if values.size == 0:
        return np.full((3, len(grid)), np.nan)
    big = np.finfo(float).max / 4  # stands for +inf: linear interpolation with inf gives NaN
    band = np.quantile(np.where(np.isfinite(values), values, big), [0.25, 0.5, 0.75], axis=0)
    band[band >= big / 1e6] = np.nan
    return band  # type: ignore[no-any-return]
