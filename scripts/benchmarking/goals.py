"""The goals of the time-to-quality work, judged from kept raw results: docs/QUALITY.md's
goals table is :func:`goals_table` of docs/quality-data/ (``scripts/bench_quality.py --goals``,
checked against the page by tests/repo/test_quality_docs.py), so every figure in it rebuilds.

A goal is met only on evidence that holds: the effect at each of its targets, ours faster by
both exact tests at p < 0.05 where the goal asks for a speedup, ours within the margin by both
one-sided tests at p < 0.025 where it asks for "no slower" (non-inferiority: the median alone
decides nothing), never the baseline significantly faster, at least the goal's paired seeds
(10 on the CPU), a baseline set as an expert would (no pruner at Optuna's defaults), and
targets from at least 3 reference seeds, kept, that the comparison does not repeat (every
overlap is named, whatever the count). Each row also states the power of its design
(scripts/benchmarking/power.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.benchmarking.optuna_worker import EXPERT_PRUNERS, pruner_of
from scripts.benchmarking.power import Run, goal_power
from scripts.benchmarking.quality import MARGIN_ALPHA, PairedComparison, compare, time_to_target
from scripts.benchmarking.tables import Store, estimate, p_text, seed_text

__all__ = ["ALPHA", "GOALS", "MARGIN", "MIN_REFERENCE_SEEDS", "Goal", "goals_table", "judge"]

MARGIN = 1.1  # "no slower": ours' time at most 1.1x the baseline's, shown by a one-sided test


@dataclass(frozen=True)
class Goal:
    """A goal of the time-to-quality issue, at each of ``targets``, over at least
    ``min_pairs`` paired seeds, never the baseline significantly faster, and either a speedup
    (``speedup``: a median of at least it, ours' time at most 1 / speedup of the baseline's,
    and ours faster by both tests at p < 0.05) or "no slower" (``margin``: ours within margin
    times the baseline's time by both one-sided tests at p < 0.025, the median no criterion)."""

    text: str
    workload: str
    targets: tuple[str, ...]
    min_pairs: int
    speedup: float | None = None
    margin: float | None = None
    # the baseline: what an expert would run (an Optuna baseline, its pruner tuned); the
    # documented recipe (one Optuna process per GPU, its pruner at Optuna's defaults: the
    # defaults are the point); or the product as it was before an issue (ours-before*)
    against: str = "expert"


GOALS = {
    "a-cpu": Goal("(a) on the CPU: ours at most 0.8x the best Optuna CPU baseline's time to "
                  "the 50 % target", "a", ("50%",), 10, speedup=1.25),
    "a-gpu": Goal(f"(a) on a GPU host, defaults: no slower than the best baseline (within "
                  f"{MARGIN}x, one-sided test) at any target", "a", ("10%", "50%", "100%"), 5,
                  margin=MARGIN),
    "a-27": Goal(f"issue 27: (a) on a GPU host, defaults no slower (within {MARGIN}x, one-sided "
                 "test) to the 50 % target than the best Optuna baseline, CPU-only included",
                 "a", ("50%",), 5, margin=MARGIN),
    "b-gpu": Goal("(b) on 2 GPUs: ours at most 0.7x the best baseline's time to each target", "b",
                  ("10%", "50%", "100%"), 5, speedup=1 / 0.7),
    "c-gpu": Goal("(c) on 2 GPUs: ours at most 0.5x the best baseline's time to each target", "c",
                  ("10%", "50%", "100%"), 5, speedup=2.0),
    "c-oracle": Goal(f"(c) on 2 GPUs: ours no slower (within {MARGIN}x, one-sided test) than "
                     "Optuna's processes packed by hand at the best fixed number per GPU", "c",
                     ("10%", "50%", "100%"), 5, margin=MARGIN),
    "c51-oracle": Goal("issue 51: (c) on one H200 each: ours at most 0.8x the time to the 50 % "
                       "target of Optuna's processes packed by hand (the oracle)", "c", ("50%",),
                       6, speedup=1.25),
    "c51-recipe": Goal("issue 51: (c) on one H200 each: ours at most 0.5x the time to the 50 % "
                       "target of the documented recipe (one Optuna process per GPU, "
                       "HyperbandPruner at its defaults)", "c", ("50%",), 6, speedup=2.0,
                       against="recipe"),
    "a51-before": Goal(f"issue 51: (a) on the CPU: ours no slower (within {MARGIN}x, one-sided "
                       "test) to the 50 % target than the package before the issue (8ff90f4)",
                       "a", ("50%",), 8, margin=MARGIN, against="before"),
    "t51-before": Goal(f"issue 51: the built-in torch_mlp on the CPU: ours no slower (within "
                       f"{MARGIN}x, one-sided test) to the 50 % target than the package before "
                       "the issue (8ff90f4)", "t", ("50%",), 8, margin=MARGIN, against="before"),
    "c51-oracle-ni": Goal(f"issue 51: (c) on one H200 each: ours no slower (within {MARGIN}x, "
                          "one-sided test) to the 50 % target than the oracle", "c", ("50%",), 6,
                          margin=MARGIN),
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
    if goal.against == "before":
        if not baseline.startswith("ours-before"):
            why.append(f"{baseline} is not the package as it was before (ours-before*)")
    elif pruner is None or (pruner not in EXPERT_PRUNERS and goal.against != "recipe"):
        why.append(f"{baseline} " + ("is no Optuna baseline" if pruner is None else
                                     f"prunes at Optuna's defaults ({pruner})"))
    used = reference.get("seed_list")
    count = reference.get("seeds", 0) if used is None else len(used)
    if count < MIN_REFERENCE_SEEDS:
        why.append(f"targets from {count} reference seed(s), {MIN_REFERENCE_SEEDS} needed")
    if used is None:  # no way to tell whether the comparison repeats them
        why.append("reference seeds not recorded")
    elif set(used) & set(seeds):  # checked at any count: one shared seed sets a bar it reruns
        why.append(f"reference seeds {seed_text(sorted(set(used) & set(seeds)))} repeated "
                   "in the comparison")
    if reference.get("rebuilt"):
        why.append("targets rebuilt from printed figures (the reference's raw results not kept)")
    for target in goal.targets:
        c = results[target]
        short = []
        if goal.speedup is not None and c.median < goal.speedup:
            short.append(f"median {c.median:.2f} < {goal.speedup:.2f}")
        faster = c.faster(ALPHA)
        if faster == "baseline":
            short.append("the baseline significantly faster")
        elif goal.speedup is not None and faster != "ours":
            short.append("not significant")
        if goal.margin is not None and not c.within_margin(MARGIN_ALPHA):
            short.append(f"not shown within {goal.margin}x (one-sided p "
                         f"{p_text(c.margin_sign_p)} / {p_text(c.margin_signed_rank_p)}, "
                         f"{MARGIN_ALPHA} needed)")
        if short:
            why.append(f"{target}: " + ", ".join(short))
    return why


def _power_cell(goal: Goal, runs: dict[int, dict[str, Any]], reference: dict[str, Any],
                pairs: int) -> str:
    """The row's design (its pairs, its runs' budget) simulated on its baseline's own kept
    curves (power.py): the chance its tests would show the goal, were it true."""
    kept = [Run(r["curve"], r["budget_s"]) for r in runs.values()]
    budget = min(r.budget_s for r in kept)
    power = goal_power(kept, [reference["targets"][t] for t in goal.targets], pairs, budget,
                       goal.speedup, goal.margin)
    truth = (f"ours truly {goal.speedup:.2f}x faster" if goal.speedup is not None
             else "the two truly equal")
    return (f"{power:.0%} ({truth}; {pairs} pairs, {budget:.0f} s, from {len(kept)} kept "
            "curves)").replace("%", " %", 1)


def goals_table(root: Path) -> str:
    """docs/QUALITY.md's goals table, judged from the kept raw results under ``root``
    (docs/quality-data/): the rows listed in its goals.json, each ours against a baseline in
    one results file and group, and a table of the runs' commands, commits and machines."""
    rows = json.loads((root / "goals.json").read_text())["rows"]
    lines = ["| goal | run | ours / baseline | seeds | speedup at target: median [95 % interval]; "
             "p sign / signed-rank | power of the design | met? |", "|---|---|---|---|---|---|---|"]
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
            results[target] = compare(ours, base, margin=goal.margin or 1.0)
        why = judge(goal, row["baseline"], seeds, reference, results)
        cells = "; ".join(f"{t}: {estimate(results[t])}, p {p_text(results[t].sign_p)} / "
                          f"{p_text(results[t].signed_rank_p)}"
                          + ("" if goal.margin is None else
                             f", within {goal.margin}x: p {p_text(results[t].margin_sign_p)} / "
                             f"{p_text(results[t].margin_signed_rank_p)}")
                          for t in goal.targets)
        run_id = f"{row['data']}/{row.get('results', 'results.json.gz')} `{row['group']}`"
        power = _power_cell(goal, by[row["baseline"]], reference, len(seeds))
        lines.append(f"| {goal.text} | {run_id} | {row['ours']} / {row['baseline']} | "
                     f"{seed_text(seeds)} | {cells} | {power} | "
                     + ("**yes**" if not why else "no: " + "; ".join(why)) + " |")
        chosen = [r for r in runs if r["contender"] in by]
        runs_lines.append(f"| {run_id} | " + "<br>".join(
            f"`{c}`" for c in sorted({r["command"] for r in chosen})) + " | "
            + ", ".join(sorted({str(r.get("commit", "not recorded")) for r in chosen})) + " | "
            + "; ".join(sorted({str(r.get("machine", "not recorded")) for r in chosen})) + " |")
    unique_runs = list(dict.fromkeys(runs_lines))
    return "\n".join([*lines, "", *unique_runs]) + "\n"
