"""Replay recorded learning curves through candidate pruners, W trials at a time, in simulated
time: cheap evidence for a pruner before GPU time is spent on scripts/bench_quality.py.

    python scripts/sim_pruning.py docs/quality-data/curves/a-nopruner.db.gz --workers 2 \
        --seeds 200 --candidates none default optuna-hyperband ranked

The input is studies run with ``pruner=none``: every trial's whole curve and its timing
(``hpo.overhead_s`` + ``hpo.step_s`` per step, the fit pruning/_auto.py records; else its run
time spread over its steps), read with the replay's ``load_curves`` (pruning/_replay.py).
Curves are replayed as the objectives report them now, the best value so far
(docs/OBJECTIVES.md; ``--reported raw`` for the values recorded).

The sampler. With ``--order progress`` (the default where every study was recorded with TPE)
the sampler proposes as the recorded one progressed: a trial asked when the sampler's view
holds j trials is drawn from the trials recorded at places j - w to j + w of their study
(w: 2 % of the places, at least 2; one not drawn before in the run where the window has one).
The view is Optuna's own: under a ``HyperbandPruner`` Optuna splits TPE's history by bracket
(``optuna.pruners._filter_study``), so each bracket's TPE starts over with its own random
trials and progresses at its share of the trials; under every other pruner (ours over
Hyperband included) it sees them all. With ``--order random`` a seed is a random order of the
recorded trials, the same for every candidate. Either way the seeds are paired.

W workers each pay the workers' start-up once (the median of what the recorded reuse
workers' first trials carried above the study's usual per-trial start-up: imports, data,
CUDA; split out by ``load_curves``), then take the next trial when free; a trial reports step
s at ``start + overhead_s + step_s * s``, and after every report but its last the
candidate's real Optuna pruner, on an in-memory study that holds the trials running beside
it, decides (the objectives never ask at the last step). Pruned: the worker is free at once
(a reuse worker starts nothing again). Complete: the trial's recorded value. Events in time
order; ties in the order they were scheduled.

Per candidate: time to each target (the best value no pruner had reached at 10/50/100 % of
the budget, the median over the seeds, as the benchmark's reference; or ``--targets``),
median and quartiles with censored runs at the budget; the paired speedup over the default
pruner (and over no pruner) with the benchmark's interval (``benchmarking/quality.py``);
the share of finished trials pruned and the steps they were pruned at, the configurations
started, the trials completed, how many of the pool's ``--top-k`` best trials completed of
those that finished (over all seeds), the median best value at the budget, and the runs
whose pool ran out before it (``--with-replacement`` draws random orders with replacement
for a pool too small).

Timing per level (workload c): ``--level K`` runs at K trials per GPU on ``--gpus`` GPUs
(W = K x gpus), each trial's overhead and step times scaled by the ratio of the medians of
the study recorded at K per GPU (``scheduler.trials_per_gpu`` in its ``hpo.config``) to
those of the study it was recorded in. Curves from every given study form the pool.

Limits: a recorded pool, not a sampler: the progress model ties a proposal's quality to how
many trials the sampler has seen, not to which ones, so what a pruner took from TPE (the
values of trials it stopped) does not change what comes next; a random order hands out a TPE
pool's later, better-informed proposals from the first trial on, which flattered the eager
pruners (on workload (a) they won here and lost in real runs: docs/QUALITY.md); a pool
smaller than the trials a run starts is drawn again; no contention beyond the recorded
per-level times; no orchestrator latency between trials (``--gap-s`` adds one).
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
    "default": PatientHyperbandPrunerConfig(),  # patience 3, min_resource 3, reduction 3, reach
    # the default before the paired runs chose reach (the screens of docs/quality/pruners.md
    # made before then call it "default")
    "veto": PatientHyperbandPrunerConfig(patience_mode="veto"),
    "optuna-hyperband": HyperbandPrunerConfig(),  # Optuna's HyperbandPruner() as documented
    "hyperband-m3": HyperbandPrunerConfig(min_resource=3),
    # veto variants, as in the screens of docs/quality/pruners.md
    "patient1": PatientHyperbandPrunerConfig(patience=1, patience_mode="veto"),
    "delay": PatientHyperbandPrunerConfig(patience_mode="delay"),  # patience 3 delays the verdict
    "reach": PatientHyperbandPrunerConfig(patience_mode="reach"),  # veto, out of reach stopped
    "patient0-m1": PatientHyperbandPrunerConfig(patience=0, min_resource=1, patience_mode="veto"),
    "median": MedianPrunerConfig(),
    "ranked": RankedHalvingPrunerConfig(),
}


@dataclass(frozen=True)
class SimTrial:
    """One recorded trial: its curve, value and timing (at the level simulated)."""

    number: int  # its place in the pool
    value: float
    steps: tuple[tuple[int, float], ...]
    overhead_s: float  # the trial's own start-up (its worker's is paid once per worker)
    step_s: float
    place: int = 0  # its place in its recorded sampler's order (the trial's number there)

    def report_at(self, start: float, step: int) -> float:
        return start + self.overhead_s + self.step_s * step


class Progress:
    """The recorded sampler's progress (the module doc): a trial proposed after ``j`` trials in
    the sampler's view is drawn from the pool's trials recorded at places ``j - window`` to
    ``j + window`` (``j`` held at the last place recorded), one not drawn before in this run
    where the window has one (it widens until it does), else any of the window."""

    def __init__(self, pool: Sequence[SimTrial], seed: int, window: int | None = None) -> None:
        self.places = sorted({t.place for t in pool})
        self.at: dict[int, list[int]] = {}
        for t in pool:
            self.at.setdefault(t.place, []).append(t.number)
        self.window = window if window is not None else max(2, round(0.02 * len(self.places)))
        self.rng = np.random.default_rng(seed)
        self.drawn: set[int] = set()

    def draw(self, seen: int) -> int:
        j = min(seen, self.places[-1])
        width = self.window
        while True:
            near = [n for p in self.places if abs(p - j) <= width for n in self.at[p]]
            fresh = [n for n in near if n not in self.drawn]
            if fresh or width > self.places[-1]:
                number = int(self.rng.choice(fresh or near))
                self.drawn.add(number)
                return number
            width = max(1, width * 2)


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


def sampler_view(study: Any, trial: Any) -> int:
    """How many other trials the sampler sees when it proposes ``trial``: Optuna's own view
    (``optuna.pruners._filter_study``), which under a HyperbandPruner is the trial's bracket."""
    import optuna

    frozen = study._storage.get_trial(trial._trial_id)
    return len(optuna.pruners._filter_study(study, frozen).get_trials(deepcopy=False)) - 1


def simulate(pool: Sequence[SimTrial], order: Sequence[int] | Progress,
             make_pruner: Callable[[], Any], workers: int, budget_s: float,
             direction: str = "minimize", gap_s: float = 0.0, worker_s: float = 0.0) -> Run:
    """Replay ``pool`` through the pruner ``make_pruner()`` builds (module doc): in ``order``
    (pool numbers), or drawn by the sampler's ``Progress``; each worker pays ``worker_s`` of
    start-up before its first trial."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="sim",
                                direction=direction, pruner=make_pruner(),
                                sampler=optuna.samplers.RandomSampler(seed=0))  # asks no params
    waiting = iter(order) if not isinstance(order, Progress) else None
    run = Run()
    events: list[tuple[float, int, _Running]] = []
    tie = itertools.count()

    def start(t: float) -> None:
        if t >= budget_s:
            return
        trial = None
        if isinstance(order, Progress):
            trial = study.ask()
            number: int | None = order.draw(sampler_view(study, trial))
        else:
            assert waiting is not None
            number = next(waiting, None)
        if number is None:
            run.exhausted = True
            return
        curve = pool[number]
        running = _Running(trial or study.ask(), curve, t)
        run.started += 1
        first = curve.steps[0][0] if curve.steps else 0
        heapq.heappush(events, (curve.report_at(t, first), next(tie), running))

    for _ in range(workers):
        start(worker_s)
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
    """The curves of one recorded study, the level it ran at (trials per GPU), its sampler,
    and the start-up of its reuse workers (each carried inside a worker's first trial)."""

    name: str
    level: int | None
    direction: str
    trials: list[SimTrial]
    sampler: str | None = None
    worker_s: list[float] = field(default_factory=list)

    def medians(self) -> tuple[float, float]:
        return (statistics.median(t.overhead_s for t in self.trials),
                statistics.median(t.step_s for t in self.trials))


def best_so_far(steps: tuple[tuple[int, float], ...], direction: str) -> tuple[tuple[int, float], ...]:
    """The curve an objective reporting its best value so far (docs/OBJECTIVES.md) would have
    reported, from the raw one recorded."""
    pick = min if direction == "minimize" else max
    out: list[tuple[int, float]] = []
    for step, value in steps:
        out.append((step, value if not out else pick(out[-1][1], value)))
    return tuple(out)


def load_recorded(paths: Sequence[Path], reported: str = "best") -> list[Recorded]:
    """Every study of every file: its complete trials with curves (failed ones are left out),
    their curves as the objectives report them now (``reported="best"``: the best so far) or
    as recorded (``"raw"``)."""
    from hpo_orchestrator.db.connect import create_engine

    recorded = []
    with tempfile.TemporaryDirectory() as scratch:
        for path in paths:
            plain = _opened(path, Path(scratch))
            engine = create_engine(f"sqlite:///{plain}")
            for name in _studies(plain):
                curves = load_curves(engine, name)
                trials = [SimTrial(c.number, c.value if c.value is not None else min(v for _, v in c.steps),
                                   best_so_far(c.steps, curves.direction) if reported == "best" else c.steps,
                                   c.overhead_s, c.step_s, c.number)
                          for c in curves.curves if c.state == "COMPLETE" and c.steps]
                level = curves.config.get("scheduler", {}).get("trials_per_gpu")
                recorded.append(Recorded(name, level if isinstance(level, int) else None,
                                         curves.direction, trials,
                                         curves.config.get("sampler", {}).get("name"),
                                         [c.worker_s for c in curves.curves if c.worker_s > 0]))
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
        pool += [SimTrial(len(pool) + i, t.value, t.steps, t.overhead_s * over, t.step_s * step, t.place)
                 for i, t in enumerate(study.trials)]
    return pool


def worker_startup(recorded: Sequence[Recorded], level: int | None) -> float:
    """A simulated worker's start-up: the median of the recorded workers' (those of the study
    recorded at ``level`` where one is given and has any), 0 where none was recorded."""
    target = [r for r in recorded if level is not None and r.level == level and r.worker_s]
    measured = [s for r in (target or recorded) for s in r.worker_s]
    return statistics.median(measured) if measured else 0.0


# --- candidates, seeds and the table -----------------------------------------------------------


def candidate(name: str) -> Callable[[], Any]:
    """The factory of a named candidate, or of a short form: ``PH:p1,m3,r3`` (PatientPruner
    over Hyperband), ``PD:p1,m3,r3`` (Hyperband's verdict delayed by patience:
    ``pruner.patience_mode=delay``), ``H:m1,r3`` (Hyperband alone), ``R:r2+3,k3,n10,a5``
    (ranked halving: reduction factors, protect, min_complete, audit_every)."""
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
        "PD": lambda: PatientHyperbandPrunerConfig(patience_mode="delay", **values),
        "H": lambda: HyperbandPrunerConfig(**values),
        "R": lambda: RankedHalvingPrunerConfig(
            reduction_factors=[int(f) for f in str(values.pop("reduction_factor", 3)).split("+")],
            **values)}
    if kind not in configs:
        raise SystemExit(f"error: unknown candidate {name!r} (named: {', '.join(CANDIDATES)}; "
                         "or PH:p3,m3,r3, PD:p3,m3,r3, H:m1,r3, R:r2+3,k3,n10,a5)")
    config = configs[kind]()
    config.validate("candidate")
    return lambda: build_pruner(config)


def default_budget(pool: Sequence[SimTrial], workers: int, share: float, worker_s: float = 0.0) -> float:
    """Seconds in which W workers without a pruner run ``share`` of the pool, after their
    start-up."""
    full = [t.report_at(0.0, t.steps[-1][0] if t.steps else 0) for t in pool]
    return worker_s + statistics.mean(full) * len(pool) * share / workers


def top_numbers(pool: Sequence[SimTrial], k: int, direction: str) -> set[int]:
    sign = 1.0 if direction == "minimize" else -1.0
    return {t.number for t in sorted(pool, key=lambda t: sign * t.value)[:k]}


def _signed(curve: list[tuple[float, float]], direction: str) -> list[tuple[float, float]]:
    return curve if direction == "minimize" else [(t, -v) for t, v in curve]


def run_all(pool: Sequence[SimTrial], names: Sequence[str], seeds: int, workers: int,
            budget_s: float, direction: str, gap_s: float = 0.0, progress: bool = False,
            replace: bool = False, order: str = "random", worker_s: float = 0.0) -> dict[str, list[Run]]:
    """Every candidate on every seed: a random order of the pool (``replace``: drawn with
    replacement, so a small pool never runs out), or (``order="progress"``) drawn by the
    recorded sampler's progress, seeded alike for every candidate."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    factories = {name: candidate(name) for name in names}
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        fixed = list(rng.integers(0, len(pool), 50 * len(pool)) if replace else rng.permutation(len(pool)))
        for name in names:
            drawn: Sequence[int] | Progress = Progress(pool, seed) if order == "progress" else fixed
            runs[name].append(simulate(pool, drawn, factories[name], workers, budget_s, direction,
                                       gap_s, worker_s))
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
        steps = [step for r in mine for _, _, step in r.pruned]
        row["prune_steps"] = {str(s): steps.count(s) for s in sorted(set(steps))}
        out[name] = row
    return out


def table(rows: dict[str, Any], targets: dict[str, float], reference: str) -> str:
    head = ("| candidate | " + " | ".join(f"to {label} s, median [IQR]" for label in targets)
            + f" | speedup over {reference} at " + "/".join(targets)
            + " | pruned | pruned at step (share of prunes) | started | complete | top trials kept"
            " | best at budget | pool ran out |")
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
        total = sum(row["prune_steps"].values())
        where = " ".join(f"{s}:{n / total:.0%}" for s, n in row["prune_steps"].items()
                         if n / total >= 0.05) or "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {speed} | {row['pruned_share']:.0%} | "
                     f"{where} | {row['started']:.0f} | {row['complete']:.0f} | {kept}/{ran} | "
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
    parser.add_argument("--order", choices=("auto", "random", "progress"), default="auto",
                        help="how the sampler hands out the pool's trials: random orders, or by the "
                             "recorded sampler's progress (each bracket its own under Hyperband); "
                             "auto: progress where every study was recorded with TPE")
    parser.add_argument("--reported", choices=("best", "raw"), default="best",
                        help="the curves as the objectives report them now (best so far) or as "
                             "recorded")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and settings here")
    args = parser.parse_args(argv)

    files = [p for path in args.curves
             for p in (sorted([*path.glob("*.db"), *path.glob("*.db.gz")]) if path.is_dir() else [path])]
    recorded = load_recorded(files, args.reported)
    directions = {r.direction for r in recorded}
    if len(directions) != 1:
        raise SystemExit(f"error: the studies mix directions {sorted(directions)}")
    direction = directions.pop()
    pool = pool_at(recorded, args.level)
    workers = args.workers or (args.gpus * (args.level or 1))
    worker_s = worker_startup(recorded, args.level)
    budget = args.budget or default_budget(pool, workers, args.budget_share, worker_s)
    order = args.order if args.order != "auto" else \
        "progress" if all(r.sampler == "tpe" for r in recorded) else "random"
    names = list(dict.fromkeys(["none", *args.candidates]))
    print(f"pool: {len(pool)} trials from {len(recorded)} studies ({', '.join(r.name for r in recorded)}); "
          f"{workers} workers, {worker_s:.1f} s start-up each; budget {budget:.1f} s; {args.seeds} seeds; "
          f"order {order}; curves {args.reported}", flush=True)
    runs = run_all(pool, names, args.seeds, workers, budget, direction, args.gap_s, progress=True,
                   replace=args.with_replacement, order=order, worker_s=worker_s)
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
            "worker_startup_s": worker_s, "order": order, "reported": args.reported,
            "budget_s": budget, "targets": targets, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
