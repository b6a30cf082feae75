"""The goals of the time-to-quality work, judged from kept raw results: docs/QUALITY.md's
goals table is :func:`goals_table` of docs/quality-data/ (``scripts/bench_quality.py --goals``,
checked against the page by tests/repo/test_quality_docs.py), so every figure in it rebuilds.

A goal is met only on evidence that holds: the effect at each of its targets, ours faster by
both exact tests at p < 0.05 where the goal asks for a speedup, never the baseline
significantly faster, at least the goal's paired seeds (10 on the CPU), a baseline set as an
expert would (no pruner at Optuna's defaults), and targets from at least 3 reference seeds
that the comparison does not repeat.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.benchmarking.optuna_worker import EXPERT_PRUNERS, pruner_of
from scripts.benchmarking.quality import PairedComparison, compare, time_to_target
from scripts.benchmarking.tables import Store, estimate, p_text, seed_text

__all__ = ["ALPHA", "GOALS", "MIN_REFERENCE_SEEDS", "Goal", "goals_table", "judge"]


@dataclass(frozen=True)
class Goal:
    """A goal of the time-to-quality issue, at each of ``targets``: a median speedup of at
    least ``speedup`` (ours' time at most 1 / speedup of the baseline's), ours faster by both
    tests at p < 0.05 where ``significant``, and never the baseline significantly faster;
    over at least ``min_pairs`` paired seeds."""

    text: str
    workload: str
    targets: tuple[str, ...]
    speedup: float
    significant: bool
    min_pairs: int


GOALS = {
    "a-cpu": Goal("(a) on the CPU: ours at most 0.8x the best Optuna CPU baseline's time to "
                  "the 50 % target", "a", ("50%",), 1.25, True, 10),
    "a-gpu": Goal("(a) on a GPU host, defaults: no baseline significantly faster at any target",
                  "a", ("10%", "50%", "100%"), 0.0, False, 5),
    "a-27": Goal("issue 27: (a) on a GPU host, defaults no slower (median) to the 50 % target "
                 "than the best Optuna baseline, CPU-only included", "a", ("50%",), 1.0, False, 5),
    "b-gpu": Goal("(b) on 2 GPUs: ours at most 0.7x the best baseline's time to each target", "b",
                  ("10%", "50%", "100%"), 1 / 0.7, True, 5),
    "c-gpu": Goal("(c) on 2 GPUs: ours at most 0.5x the best baseline's time to each target", "c",
                  ("10%", "50%", "100%"), 2.0, True, 5),
    "c-oracle": Goal("(c) on 2 GPUs: ours no slower (median) than Optuna's processes packed by "
                     "hand at the best fixed number per GPU", "c", ("10%", "50%", "100%"), 1.0,
                     False, 5),
}

ALPHA = 0.05
MIN_REFERENCE_SEEDS = 3


def judge(goal: Goal, baseline: str, seeds: list[int], reference: dict[str, Any],
          results: dict[str, PairedComparison]) -> list[str]:
    """Why ``results`` (ours against ``baseline`` over ``seeds``, per target) does not meet
    ``goal``, on the rules of the module docstring; empty when it does. ``reference``: the
    workload's entry of targets.json."""
    why = []
    if len(seeds) < goal.min_pairs:
        why.append(f"{len(seeds)} paired seeds, {goal.min_pairs} needed")
    pruner = pruner_of(baseline)
    if pruner not in EXPERT_PRUNERS:
        why.append(f"{baseline} " + ("is no Optuna baseline" if pruner is None else
                                     f"prunes at Optuna's defaults ({pruner})"))
    used = reference.get("seed_list")
    if used is None:
        count = reference.get("seeds", 0)
        why.append(f"targets from {count} reference seed(s), {MIN_REFERENCE_SEEDS} needed"
                   if count < MIN_REFERENCE_SEEDS else "reference seeds not recorded")
    elif len(used) < MIN_REFERENCE_SEEDS:
        why.append(f"targets from {len(used)} reference seed(s), {MIN_REFERENCE_SEEDS} needed")
    elif set(used) & set(seeds):
        why.append(f"reference seeds {seed_text(sorted(set(used) & set(seeds)))} repeated "
                   "in the comparison")
    for target in goal.targets:
        c = results[target]
        short = []
        if c.median < goal.speedup:
            short.append(f"median {c.median:.2f} < {goal.speedup:.2f}")
        faster = c.faster(ALPHA)
        if faster == "baseline":
            short.append("the baseline significantly faster")
        elif goal.significant and faster != "ours":
            short.append("not significant")
        if short:
            why.append(f"{target}: " + ", ".join(short))
    return why


def goals_table(root: Path) -> str:
    """docs/QUALITY.md's goals table, judged from the kept raw results under ``root``
    (docs/quality-data/): the rows listed in its goals.json, each ours against a baseline in
    one results file and group, and a table of the runs' commands, commits and machines."""
    rows = json.loads((root / "goals.json").read_text())["rows"]
    lines = ["| goal | run | ours / baseline | seeds | speedup at target: median [95 % interval]; "
             "p sign / signed-rank | met? |", "|---|---|---|---|---|---|"]
    runs_lines = ["| run | command | commit | machine |", "|---|---|---|---|"]
    for row in rows:
        goal = GOALS[row["goal"]]
        folder = root / row["data"]
        store = Store(folder, kept=row.get("results", "results.json.gz"))
        reference = store.targets()[goal.workload]
        runs = [r for r in store.runs if r["workload"] == goal.workload
                and r["group"] == row["group"]]
        by = {name: {r["seed"]: r for r in runs if r["contender"] == name}
              for name in (row["ours"], row["baseline"])}
        seeds = sorted(set(by[row["ours"]]) & set(by[row["baseline"]]))
        results = {}
        for target in goal.targets:
            value = reference["targets"][target]
            ours, base = ([time_to_target(by[name][s]["curve"], value, by[name][s]["budget_s"])
                           for s in seeds] for name in (row["ours"], row["baseline"]))
            results[target] = compare(ours, base)
        why = judge(goal, row["baseline"], seeds, reference, results)
        cells = "; ".join(f"{t}: {estimate(results[t])}, p {p_text(results[t].sign_p)} / "
                          f"{p_text(results[t].signed_rank_p)}" for t in goal.targets)
        run_id = f"{row['data']}/{row.get('results', 'results.json.gz')} `{row['group']}`"
        lines.append(f"| {goal.text} | {run_id} | {row['ours']} / {row['baseline']} | "
                     f"{seed_text(seeds)} | {cells} | "
                     + ("**yes**" if not why else "no: " + "; ".join(why)) + " |")
        chosen = [r for r in runs if r["contender"] in by]
        runs_lines.append(f"| {run_id} | " + "<br>".join(
            f"`{c}`" for c in sorted({r["command"] for r in chosen})) + " | "
            + ", ".join(sorted({str(r.get("commit", "not recorded")) for r in chosen})) + " | "
            + "; ".join(sorted({str(r.get("machine", "not recorded")) for r in chosen})) + " |")
    unique_runs = list(dict.fromkeys(runs_lines))
    return "\n".join([*lines, "", *unique_runs]) + "\n"
