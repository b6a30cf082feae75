"""Power before runs: from a baseline's kept curves, how likely a design (pairs, budget) is to
show a given speedup, and the budget by which most baseline runs reach a target. Pure
functions of curves and numbers, as quality.py; scripts/bench_power.py prints them and the
goals table (goals.py) states each row's power.

The model, stated so its limits are plain:

- **Runs are resampled whole.** A simulated study draws each side's runs, with replacement,
  from the baseline's kept curves (all targets from one curve, so a study's targets keep
  their dependence). The two sides are drawn independently: a design gets no credit for
  pairing, which is conservative where a seed's difficulty is shared.
- **Ours is the baseline, ``speedup`` times faster**: every time of its curve divided by
  ``speedup``. A curve known only up to its run's budget stays unknown beyond it, so a
  target it never reached there counts as censored for ours (conservative again).
- **Censoring** as in the benchmark: at the design's budget, and only curves whose runs
  lasted at least that budget are drawn (a shorter run cannot say where it would have been).
- **The verdict** is the goal's statistics only: ours faster by both two-sided tests at
  p < 0.05 at every target (:meth:`PairedComparison.faster`), or within the margin by both
  one-sided tests (:meth:`PairedComparison.within_margin`); the goal's median criterion and
  its evidence rules (reference seeds, baselines) are not part of power.

:func:`reach_share` is the Kaplan-Meier estimate of the share of baseline runs at the target
by each time, runs censored at their own budgets leaving the risk set there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scripts.benchmarking.quality import MARGIN_ALPHA, Censored, Curve, compare, time_to_target

__all__ = ["Run", "goal_power", "pairs_needed", "reach_budget", "reach_share", "simulated_power"]


@dataclass(frozen=True)
class Run:
    """One kept baseline run: its curve and the budget it ran for."""

    curve: Curve
    budget_s: float


def _times(run: Run, targets: Sequence[float], budget: float, speedup: float) -> list[Censored]:
    """The run's times to each target, as a contender ``speedup`` times faster would have
    them, censored at ``budget`` (and where the run itself never got there)."""
    out = []
    for value in targets:
        t = time_to_target(run.curve, value, run.budget_s)
        seconds = t.seconds / speedup
        out.append(Censored(budget, True) if t.censored or seconds > budget
                   else Censored(seconds, False))
    return out


def simulated_power(runs: Sequence[Run], targets: Sequence[float], pairs: int, budget: float,
                    speedup: float, margin: float | None = None, studies: int = 400,
                    seed: int = 0) -> float | None:
    """The share of ``studies`` simulated studies of ``pairs`` pairs at ``budget`` s whose
    verdict is ours faster at every target (``margin`` None), or ours within ``margin`` at
    every target; ours truly ``speedup`` times faster (module docstring). None where no kept
    run lasted ``budget``."""
    pool = [r for r in runs if r.budget_s >= budget]
    if not pool:
        return None
    rng = np.random.default_rng(seed)
    shown = 0
    for _ in range(studies):
        ours = [_times(pool[i], targets, budget, speedup) for i in rng.integers(len(pool), size=pairs)]
        base = [_times(pool[i], targets, budget, 1.0) for i in rng.integers(len(pool), size=pairs)]
        verdicts = []
        for k in range(len(targets)):
            c = compare([o[k] for o in ours], [b[k] for b in base], margin=margin or 1.0)
            verdicts.append(c.faster() == "ours" if margin is None
                            else c.within_margin(MARGIN_ALPHA))
        shown += all(verdicts)
    return shown / studies


def pairs_needed(power_by_pairs: dict[int, float | None], power: float = 0.8) -> int | None:
    """The fewest pairs whose power is at least ``power`` (None: none of those tried)."""
    enough = [n for n, p in sorted(power_by_pairs.items()) if p is not None and p >= power]
    return enough[0] if enough else None


def reach_share(times: Sequence[Censored]) -> list[tuple[float, float]]:
    """Kaplan-Meier: (time, share of runs at the target by then) at each time a run reached
    it. A censored run stays in the risk set up to its budget, a run reaching the target at
    its budget counts as reached (reached before censored at one time)."""
    at_risk, still = len(times), 1.0
    out = []
    for seconds in sorted({t.seconds for t in times}):
        reached = sum(1 for t in times if t.seconds == seconds and not t.censored)
        if reached:
            still *= 1.0 - reached / at_risk
            out.append((seconds, 1.0 - still))
        at_risk -= sum(1 for t in times if t.seconds == seconds)
    return out


def reach_budget(times: Sequence[Censored], share: float = 0.8) -> float | None:
    """The first time by which at least ``share`` of runs reach the target (Kaplan-Meier);
    None where the kept runs never get there."""
    return next((t for t, s in reach_share(times) if s >= share - 1e-12), None)


def goal_power(runs: Sequence[Run], targets: Sequence[float], pairs: int, budget: float,
               speedup: float | None, margin: float | None, studies: int = 400) -> float | None:
    """A goal row's power (goals.py): for a speedup goal, ours truly that ``speedup`` faster
    and called faster at every target; for a "no slower" goal, the two truly equal and ours
    shown within ``margin`` at every target."""
    return simulated_power(runs, targets, pairs, budget, speedup or 1.0,
                           None if speedup is not None else margin, studies)
