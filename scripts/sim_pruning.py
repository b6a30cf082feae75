"""Replay recorded learning curves through candidate pruners, W trials at a time, in simulated
time: cheap evidence for a pruner before GPU time is spent on scripts/bench_quality.py.

    python scripts/sim_pruning.py docs/quality-data/curves/a-nopruner.db.gz --workers 2 \
        --seeds 200 --candidates none default optuna-hyperband ranked

The input is studies run with ``pruner=none``: every trial's whole curve and its timing
(``hpo.overhead_s`` + ``hpo.step_s`` per step, the fit pruning/_auto.py records; else its run
time spread over its steps), read with the replay's ``load_curves`` (pruning/_replay.py).
A seed is a random order of the recorded trials: the "sampler" hands them out in that order,
the same order for every candidate (paired seeds). W workers each take the next trial when
free; a trial reports step s at ``start + overhead_s + step_s * s``, and after every report
but its last the candidate's real Optuna pruner, on an in-memory study that holds the trials
running beside it, decides (the objectives never ask at the last step). Pruned: the worker
is free at once. Complete: the trial's recorded value. Events in time order; ties in the
order they were scheduled.

Per candidate: time to each target (the best value no pruner had reached at 10/50/100 % of
the budget, the median over the seeds, as the benchmark's reference; or ``--targets``),
median and quartiles with censored runs at the budget; the paired speedup over the default
pruner (and over no pruner) with the benchmark's bootstrap (``benchmarking/quality.py``);
the share of finished trials pruned, the configurations started, the trials completed, how
many of the pool's ``--top-k`` best trials completed of those that finished (over all
seeds), the median best value at the budget, and the runs whose pool ran out before it
(``--with-replacement`` draws orders with replacement for a pool too small).

Timing per level (workload c): ``--level K`` runs at K trials per GPU on ``--gpus`` GPUs
(W = K x gpus), each trial's overhead and step times scaled by the ratio of the medians of
the study recorded at K per GPU (``scheduler.trials_per_gpu`` in its ``hpo.config``) to
those of the study it was recorded in. Curves from every given study form the pool.

Limits: a recorded pool, not a sampler: in an order, nothing reacts to what was pruned, and
a pool recorded with TPE holds its later, better-informed proposals from the first trial on,
which flatters every pruner that looks at more of them (on workload (a) the eager pruners
win here and lost in real runs: docs/QUALITY.md); a worker's first trial carries the
worker's start-up in its ``overhead_s`` wherever the order puts it; no contention beyond the
recorded per-level times; no orchestrator latency between trials (``--gap-s`` adds one).
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpo_orchestrator.config import (
    HyperbandPrunerConfig,
    MedianPrunerConfig,
    NoPrunerConfig,
    PatientHyperbandPrunerConfig,
    PrunerConfig,
    RankedHalvingPrunerConfig,
)
from hpo_orchestrator.pruning import build_pruner, load_curves
from scripts.benchmarking.quality import (
    Censored,
    compare,
    median_time,
    time_to_target,
    value_at,
)

FRACTIONS = (0.1, 0.5, 1.0)
LABELS = tuple(f"{round(f * 100)}%" for f in FRACTIONS)

# name -> the product's pruner config (built by the product's factory, as a run builds it)
CANDIDATES: dict[str, PrunerConfig] = {
    "none": NoPrunerConfig(),
    "default": PatientHyperbandPrunerConfig(),  # patience 3, min_resource 3, reduction 3
    "optuna-hyperband": HyperbandPrunerConfig(),  # Optuna's HyperbandPruner() as documented
    "hyperband-m3": HyperbandPrunerConfig(min_resource=3),
    "patient1": PatientHyperbandPrunerConfig(patience=1),
    "patient0-m1": PatientHyperbandPrunerConfig(patience=0, min_resource=1),
    "median": MedianPrunerConfig(),
    "ranked": RankedHalvingPrunerConfig(),
}


@dataclass(frozen=True)
class SimTrial:
    """One recorded trial: its curve, value and timing (at the level simulated)."""

    number: int  # its place in the pool
    value: float
    steps: tuple[tuple[int, float], ...]
    overhead_s: float
    step_s: float

    def report_at(self, start: float, step: int) -> float:
        return start + self.overhead_s + self.step_s * step


@dataclass
class Run:
    """One candidate on one order of the pool, up to the budget."""

    completions: list[tuple[float, float]] = field(default_factory=list)  # (t, value)
    pruned: list[tuple[float, int, int]] = field(default_factory=list)  # (t, pool number, step)
    complete_numbers: list[int] = field(default_factory=list)
    started: int = 0
    exhausted: bool = False  # the pool ran out before the budget


@dataclass
class _Running:
    trial: Any  # optuna.Trial
    curve: SimTrial
    start: float
    index: int = 0  # the next step's place in curve.steps


def simulate(pool: Sequence[SimTrial], order: Sequence[int],
             make_pruner: Callable[[], Any], workers: int, budget_s: float,
             direction: str = "minimize", gap_s: float = 0.0) -> Run:
    """Replay ``pool`` in ``order`` through the pruner ``make_pruner()`` builds (module doc)."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="sim",
                                direction=direction, pruner=make_pruner(),
                                sampler=optuna.samplers.RandomSampler(seed=0))  # asks no params
    waiting = iter(order)
    run = Run()
    events: list[tuple[float, int, _Running]] = []
    tie = itertools.count()

    def start(t: float) -> None:
        if t >= budget_s:
            return
        number = next(waiting, None)
        if number is None:
            run.exhausted = True
            return
        curve = pool[number]
        running = _Running(study.ask(), curve, t)
        run.started += 1
        first = curve.steps[0][0] if curve.steps else 0
        heapq.heappush(events, (curve.report_at(t, first), next(tie), running))

    for _ in range(workers):
        start(0.0)
    while events:
        t, _, running = heapq.heappop(events)
        if t > budget_s:
            break
        curve = running.curve
        if curve.steps:
            step, value = curve.steps[running.index]
            running.trial.report(value, step)
            if running.index < len(curve.steps) - 1:
                if running.trial.should_prune():
                    study.tell(running.trial, state=TrialState.PRUNED)
                    run.pruned.append((t, curve.number, step))
                    start(t + gap_s)
                    continue
                running.index += 1
                heapq.heappush(events, (curve.report_at(running.start, curve.steps[running.index][0]),
                                        next(tie), running))
                continue
        study.tell(running.trial, curve.value)
        run.completions.append((t, curve.value))
        run.complete_numbers.append(curve.number)
        start(t + gap_s)
    return run


# --- the pool -------------------------------------------------------------------------------


def _opened(path: Path, scratch: Path) -> Path:
    """A .gz sqlite file decompressed into ``scratch``; others as they are."""
    if path.suffix != ".gz":
        return path
    plain = scratch / path.with_suffix("").name
    with gzip.open(path, "rb") as src, plain.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return plain


def _studies(path: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        return [row[0] for row in connection.execute("SELECT study_name FROM studies ORDER BY study_id")]


@dataclass
class Recorded:
    """The curves of one recorded study and the level it ran at (trials per GPU)."""

    name: str
    level: int | None
    direction: str
    trials: list[SimTrial]

    def medians(self) -> tuple[float, float]:
        return (statistics.median(t.overhead_s for t in self.trials),
                statistics.median(t.step_s for t in self.trials))


def load_recorded(paths: Sequence[Path]) -> list[Recorded]:
    """Every study of every file: its complete trials with curves (failed ones are left out)."""
    from hpo_orchestrator.db.connect import create_engine

    recorded = []
    with tempfile.TemporaryDirectory() as scratch:
        for path in paths:
            plain = _opened(path, Path(scratch))
            engine = create_engine(f"sqlite:///{plain}")
            for name in _studies(plain):
                curves = load_curves(engine, name)
                trials = [SimTrial(c.number, c.value if c.value is not None else min(v for _, v in c.steps),
                                   c.steps, c.overhead_s, c.step_s)
                          for c in curves.curves if c.state == "COMPLETE" and c.steps]
                level = curves.config.get("scheduler", {}).get("trials_per_gpu")
                recorded.append(Recorded(name, level if isinstance(level, int) else None,
                                         curves.direction, trials))
            engine.dispose()
    return recorded


def pool_at(recorded: Sequence[Recorded], level: int | None) -> list[SimTrial]:
    """All recorded trials, numbered in one sequence, timed as at ``level`` (module doc)."""
    target = next((r for r in recorded if r.level == level), None) if level is not None else None
    if level is not None and target is None:
        raise SystemExit(f"error: no study recorded at {level} trials per GPU "
                         f"(levels: {sorted({r.level for r in recorded if r.level is not None})})")
    pool: list[SimTrial] = []
    for study in recorded:
        over, step = 1.0, 1.0
        if target is not None and study.trials:
            (o_to, s_to), (o_from, s_from) = target.medians(), study.medians()
            over = o_to / o_from if o_from > 0 else 1.0
            step = s_to / s_from if s_from > 0 else 1.0
        pool += [SimTrial(len(pool) + i, t.value, t.steps, t.overhead_s * over, t.step_s * step)
                 for i, t in enumerate(study.trials)]
    return pool


# --- candidates, seeds and the table -----------------------------------------------------------


def candidate(name: str) -> Callable[[], Any]:
    """The factory of a named candidate, or of a short form: ``PH:p1,m3,r3`` (PatientPruner
    over Hyperband), ``H:m1,r3`` (Hyperband alone), ``R:r2+3,k3,n10,a5`` (ranked halving:
    reduction factors, protect, min_complete, audit_every)."""
    if name in CANDIDATES:
        config = CANDIDATES[name]
        return lambda: build_pruner(config)
    kind, _, options = name.partition(":")
    letters = {"p": "patience", "m": "min_resource", "r": "reduction_factor", "k": "protect",
               "n": "min_complete", "a": "audit_every"}
    values: dict[str, Any] = {letters[o[0]]: int(o[1:]) if "+" not in o else o[1:]
                              for o in options.split(",") if o}
    configs: dict[str, Callable[[], PrunerConfig]] = {
        "PH": lambda: PatientHyperbandPrunerConfig(**values),
        "H": lambda: HyperbandPrunerConfig(**values),
        "R": lambda: RankedHalvingPrunerConfig(
            reduction_factors=[int(f) for f in str(values.pop("reduction_factor", 3)).split("+")],
            **values)}
    if kind not in configs:
        raise SystemExit(f"error: unknown candidate {name!r} (named: {', '.join(CANDIDATES)}; "
                         "or PH:p3,m3,r3, H:m1,r3, R:r2+3,k3,n10,a5)")
    config = configs[kind]()
    config.validate("candidate")
    return lambda: build_pruner(config)


def default_budget(pool: Sequence[SimTrial], workers: int, share: float) -> float:
    """Seconds in which W workers without a pruner run ``share`` of the pool."""
    full = [t.report_at(0.0, t.steps[-1][0] if t.steps else 0) for t in pool]
    return statistics.mean(full) * len(pool) * share / workers


def top_numbers(pool: Sequence[SimTrial], k: int, direction: str) -> set[int]:
    sign = 1.0 if direction == "minimize" else -1.0
    return {t.number for t in sorted(pool, key=lambda t: sign * t.value)[:k]}


def _signed(curve: list[tuple[float, float]], direction: str) -> list[tuple[float, float]]:
    return curve if direction == "minimize" else [(t, -v) for t, v in curve]


def run_all(pool: Sequence[SimTrial], names: Sequence[str], seeds: int, workers: int,
            budget_s: float, direction: str, gap_s: float = 0.0, progress: bool = False,
            replace: bool = False) -> dict[str, list[Run]]:
    """Every candidate on every seed: a random order of the pool (``replace``: drawn with
    replacement, so a small pool never runs out)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    factories = {name: candidate(name) for name in names}
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        order = list(rng.integers(0, len(pool), 50 * len(pool)) if replace else rng.permutation(len(pool)))
        for name in names:
            runs[name].append(simulate(pool, order, factories[name], workers, budget_s, direction, gap_s))
        if progress and (seed + 1) % 20 == 0:
            print(f"  {seed + 1} seeds", file=sys.stderr, flush=True)
    return runs


def targets_of(runs: Sequence[Run], budget_s: float, direction: str) -> dict[str, float]:
    """The benchmark's targets: the median over seeds of the best value at each fraction."""
    sign = 1.0 if direction == "minimize" else -1.0
    return {label: sign * float(np.median([value_at(_signed(r.completions, direction), f * budget_s)
                                           for r in runs]))
            for label, f in zip(LABELS, FRACTIONS, strict=True)}


def times_to(runs: Sequence[Run], target: float, budget_s: float, direction: str) -> list[Censored]:
    sign = 1.0 if direction == "minimize" else -1.0
    return [time_to_target(_signed(r.completions, direction), sign * target, budget_s) for r in runs]


def summary(runs: dict[str, list[Run]], targets: dict[str, float], budget_s: float,
            direction: str, top: set[int], reference: str) -> dict[str, Any]:
    """Per candidate: times to the targets, speedups over ``reference`` and ``none``, counts."""
    out: dict[str, Any] = {}
    for name, mine in runs.items():
        row: dict[str, Any] = {"targets": {}}
        for label, target in targets.items():
            times = times_to(mine, target, budget_s, direction)
            median, bound = median_time(times)
            q25, q75 = np.percentile([t.seconds for t in times], [25, 75])
            entry: dict[str, Any] = {"median_s": median, "lower_bound": bound, "q25_s": float(q25),
                                     "q75_s": float(q75), "censored": sum(t.censored for t in times)}
            for other in dict.fromkeys((reference, "none")):
                if other in runs and other != name:
                    paired = compare(times, times_to(runs[other], target, budget_s, direction))
                    low, high = paired.interval or (float("nan"), float("nan"))
                    entry[f"speedup_over_{other}"] = [paired.median, low, high]
                    entry[f"signed_rank_p_over_{other}"] = paired.signed_rank_p
            row["targets"][label] = entry
        finished = [len(r.pruned) + len(r.completions) for r in mine]
        row["pruned_share"] = float(np.median([len(r.pruned) / f if f else 0.0
                                               for r, f in zip(mine, finished, strict=True)]))
        row["started"] = float(np.median([r.started for r in mine]))
        row["complete"] = float(np.median([len(r.completions) for r in mine]))
        best_done = sum(len(top & set(r.complete_numbers)) for r in mine)
        best_pruned = sum(sum(1 for _, n, _ in r.pruned if n in top) for r in mine)
        row["top_survived"] = [best_done, best_done + best_pruned]
        sign = 1.0 if direction == "minimize" else -1.0
        row["best_at_budget"] = sign * float(np.median(
            [value_at(_signed(r.completions, direction), budget_s) for r in mine]))
        row["exhausted"] = sum(r.exhausted for r in mine)
        out[name] = row
    return out


def table(rows: dict[str, Any], targets: dict[str, float], reference: str) -> str:
    head = ("| candidate | " + " | ".join(f"to {label} s, median [IQR]" for label in targets)
            + f" | speedup over {reference} at " + "/".join(targets)
            + " | pruned | started | complete | top trials kept | best at budget | pool ran out |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, row in rows.items():
        cells = []
        for label in targets:
            e = row["targets"][label]
            cells.append(f"{'>=' if e['lower_bound'] else ''}{e['median_s']:.1f} "
                         f"[{e['q25_s']:.1f}, {e['q75_s']:.1f}] ({e['censored']} cens.)")
        speed = "/".join(f"{e[f'speedup_over_{reference}'][0]:.2f} "
                         f"[{e[f'speedup_over_{reference}'][1]:.2f}, {e[f'speedup_over_{reference}'][2]:.2f}]"
                         if f"speedup_over_{reference}" in e else "-"
                         for e in (row["targets"][label] for label in targets))
        kept, ran = row["top_survived"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {speed} | {row['pruned_share']:.0%} | "
                     f"{row['started']:.0f} | {row['complete']:.0f} | {kept}/{ran} | "
                     f"{row['best_at_budget']:.5f} | {row['exhausted']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("curves", nargs="+", type=Path,
                        help="sqlite files (.db or .db.gz), or folders of them")
    parser.add_argument("--candidates", nargs="+", default=["none", "default", "optuna-hyperband", "ranked"],
                        help="names or short forms (candidate()); no pruner is always run")
    parser.add_argument("--reference", default="default", help="the candidate speedups are over")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--workers", type=int, default=None,
                        help="trials at once (default: gpus x level, or 1)")
    parser.add_argument("--level", type=int, default=None,
                        help="trials per GPU: the timing of the study recorded at that level")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--budget", type=float, default=None, help="simulated seconds")
    parser.add_argument("--budget-share", type=float, default=0.25,
                        help="without --budget: the time no pruner needs for this share of the pool")
    parser.add_argument("--targets", default=None, help="three values instead of no pruner's")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--gap-s", type=float, default=0.0, help="seconds between a worker's trials")
    parser.add_argument("--with-replacement", action="store_true",
                        help="draw each seed's order with replacement (a pool too small for the "
                             "budget: the table counts the runs whose pool ran out)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and settings here")
    args = parser.parse_args(argv)

    files = [p for path in args.curves
             for p in (sorted([*path.glob("*.db"), *path.glob("*.db.gz")]) if path.is_dir() else [path])]
    recorded = load_recorded(files)
    directions = {r.direction for r in recorded}
    if len(directions) != 1:
        raise SystemExit(f"error: the studies mix directions {sorted(directions)}")
    direction = directions.pop()
    pool = pool_at(recorded, args.level)
    workers = args.workers or (args.gpus * (args.level or 1))
    budget = args.budget or default_budget(pool, workers, args.budget_share)
    names = list(dict.fromkeys(["none", *args.candidates]))
    print(f"pool: {len(pool)} trials from {len(recorded)} studies ({', '.join(r.name for r in recorded)}); "
          f"{workers} workers; budget {budget:.1f} s; {args.seeds} seeds", flush=True)
    runs = run_all(pool, names, args.seeds, workers, budget, direction, args.gap_s, progress=True,
                   replace=args.with_replacement)
    if args.targets:
        targets = dict(zip(LABELS, (float(v) for v in args.targets.split(",")), strict=True))
    else:
        targets = targets_of(runs["none"], budget, direction)
    print("targets: " + ", ".join(f"{k} {v:.5f}" for k, v in targets.items()))
    rows = summary(runs, targets, budget, direction, top_numbers(pool, args.top_k, direction), args.reference)
    print(table(rows, targets, args.reference))
    if args.json:
        args.json.write_text(json.dumps({
            "argv": argv if argv is not None else sys.argv[1:], "pool": len(pool), "workers": workers,
            "budget_s": budget, "targets": targets, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
