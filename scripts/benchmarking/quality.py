"""The arithmetic of the time-to-quality benchmark: pure functions of curves and numbers.

A *curve* is a run's trials as ``(seconds since the contender's launch, value)`` for every
COMPLETE trial, in any order; all values are minimized. Its best-so-far is a step function:
+inf until the first trial completes.

Censoring: a run that never reaches a target within its budget gets ``time = budget`` and a
``censored`` flag; it is kept, never dropped (dropping the slow runs would flatter the
slower contender). In a paired ratio ``baseline / ours`` (a speedup, > 1: ours is faster), a
censored ``ours`` makes the ratio an upper bound, a censored baseline a lower bound, both
censored makes it exactly 1 (no evidence either way); the tables count each kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Censored", "SpeedupCI", "best_so_far", "median_time", "paired_speedup", "quartile_band",
           "targets_from_curve", "time_to_target", "value_at"]

Curve = Sequence[tuple[float, float]]


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


@dataclass(frozen=True)
class SpeedupCI:
    """The median over paired seeds of ``baseline time / our time``, its bootstrap percentile
    interval, and how many pairs were censored on each side."""

    median: float
    low: float
    high: float
    pairs: int
    ours_censored: int  # ratio is an upper bound ("<=")
    baseline_censored: int  # ratio is a lower bound (">=")
    both_censored: int  # ratio set to 1

    @property
    def excludes_one(self) -> bool:
        return self.low > 1.0 or self.high < 1.0


def _ratios(ours: Sequence[Censored], baseline: Sequence[Censored]) -> np.ndarray:
    return np.array([1.0 if o.censored and b.censored else b.seconds / max(o.seconds, 1e-9)
                     for o, b in zip(ours, baseline, strict=True)])


def paired_speedup(ours: Sequence[Censored], baseline: Sequence[Censored], *,
                   resamples: int = 10_000, level: float = 0.95, seed: int = 0) -> SpeedupCI:
    """Median speedup over seeds paired by position (``ours[i]`` and ``baseline[i]`` ran
    with the same seed), with a percentile bootstrap interval: the pairs are resampled with
    replacement, so each resample keeps a seed's two runs together. Fixed ``seed``: the same
    inputs give the same interval."""
    ratios = _ratios(ours, baseline)
    if len(ratios) == 0:
        raise ValueError("no paired runs")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ratios), size=(resamples, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(medians, [tail, 100.0 - tail])
    flags = [(o.censored, b.censored) for o, b in zip(ours, baseline, strict=True)]
    return SpeedupCI(
        median=float(np.median(ratios)), low=float(low), high=float(high), pairs=len(ratios),
        ours_censored=flags.count((True, False)), baseline_censored=flags.count((False, True)),
        both_censored=flags.count((True, True)))


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
