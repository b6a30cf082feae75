"""The benchmark's results folder: results.json (every run, appended across calls),
targets.json (from the reference runs), results.md (the tables) and one PNG of anytime
curves per workload and group. Pure bookkeeping over quality.py's arithmetic."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from scripts.benchmarking.quality import (
    Censored,
    PairedComparison,
    compare,
    median_time,
    quartile_band,
    targets_from_curve,
    time_to_target,
    value_at,
)

__all__ = ["Store", "commit", "estimate", "p_text", "seed_text", "source_trees", "speedup_cell"]

KEY = ("workload", "group", "contender", "seed")


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """A git command's output in ``root``; "" where it fails or there is no git."""
    try:
        done = subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True)
    except OSError:  # no git on this host
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def commit(root: Path) -> str:
    """The source tree's commit, '+dirty' when it has uncommitted changes."""
    head = _git(root, "rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if _git(root, "status", "--porcelain", "--untracked-files=no") else "")


SOURCE_DIRS = ("hpo_orchestrator", "scripts")


def source_trees(root: Path) -> str:
    """The git tree ids of :data:`SOURCE_DIRS` in the working tree as it is, uncommitted
    changes included, e.g. ``hpo_orchestrator@1a2b3c4d5e scripts@...``: for any commit with the
    same code, ``git rev-parse COMMIT:hpo_orchestrator`` starts with the first. It names the
    code where :func:`commit` cannot: the GPU host's copy of the working tree keeps the git
    history of the session's start, so a run made after a later commit read ``<older>+dirty``
    (docs/QUALITY.md). A temporary index leaves the real one alone; "unknown" outside git."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}

        def git(*args: str) -> str:
            return _git(root, *args, env=env)

        if not git("rev-parse", "--git-dir"):
            return "unknown"
        inside = git("rev-parse", "--show-prefix")  # root below the top of its repository
        git("read-tree", "--empty")
        git("add", "-A", "--", *SOURCE_DIRS)
        trees = [(name, git("write-tree", f"--prefix={inside}{name}/")) for name in SOURCE_DIRS]
    return " ".join(f"{name}@{tree[:10]}" for name, tree in trees if tree) or "unknown"


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def seed_text(seeds: list[int]) -> str:
    """1-3, 7, 101-103."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def p_text(value: float) -> str:
    return f"{value:.2g}"


def estimate(c: PairedComparison) -> str:
    """``median [interval]`` ([-]: too few pairs for one)."""
    return f"{c.median:.2f} " + ("[-]" if c.interval is None else
                                 f"[{c.interval[0]:.2f}, {c.interval[1]:.2f}]")


def speedup_cell(c: PairedComparison) -> str:
    """``median [interval], n=N; censored ours/baseline/both; p sign / signed-rank``."""
    return (f"{estimate(c)}, n={c.pairs}; {c.ours_censored}/{c.baseline_censored}/"
            f"{c.both_censored}; p {p_text(c.sign_p)} / {p_text(c.signed_rank_p)}")


def targets_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Targets from the runs of one workload that set them: per contender, the median over its
    seeds of the best value at 10/50/100 % of the budget; the best contender (lowest at 100 %)
    gives the targets. ``setup``: the GPUs and cores each of its runs had, which a comparison
    judged by these targets must give each contender."""
    per: dict[str, list[dict[str, float]]] = defaultdict(list)
    seeds: dict[str, list[int]] = defaultdict(list)
    setups: dict[str, set[tuple[int, int]]] = defaultdict(set)
    unrecorded = set()  # contenders with a run kept without its GPUs and cores
    budget = 0.0
    for r in runs:
        per[r["contender"]].append(targets_from_curve(r["curve"], r["budget_s"]))
        seeds[r["contender"]].append(r["seed"])
        if "cores" in r:
            setups[r["contender"]].add((len(r["gpus"]), len(r["cores"])))
        else:
            unrecorded.add(r["contender"])
        budget = r["budget_s"]
    medians = {name: {k: float(np.median([t[k] for t in ts])) for k in ts[0]}
               for name, ts in per.items()}
    best = min(medians, key=lambda n: medians[n]["100%"])
    entry = {"contender": best, "budget_s": budget, "targets": medians[best],
             "seeds": len(per[best]), "seed_list": sorted(seeds[best]), "all": medians}
    if best not in unrecorded:
        entry["setup"] = [{"gpus": g, "cores": c} for g, c in sorted(setups[best])]
    return entry


class Store:
    """One results folder. Reads ``results.json``, or where there is none a kept copy,
    ``kept`` (docs/quality-data/: results.json.gz, or another run's file beside it): such a
    folder is rebuilt with --report-only."""

    def __init__(self, out: Path, kept: str = "results.json.gz") -> None:
        self.out = out
        self.path = out / "results.json"
        kept_path = out / kept
        self.runs: list[dict[str, Any]] = (
            json.loads(self.path.read_text())["runs"] if self.path.exists()
            else json.loads(gzip.decompress(kept_path.read_bytes()))["runs"] if kept_path.exists()
            else [])

    def add(self, run: dict[str, Any]) -> None:
        """Record a run, replacing an earlier one of the same workload, group, contender and
        seed (a seed run again), and save at once: a call cut short keeps what it measured."""
        self.runs = [r for r in self.runs if tuple(r[k] for k in KEY) != tuple(run[k] for k in KEY)]
        self.runs.append(run)
        self.path.write_text(json.dumps({"runs": self.runs}, indent=1, default=str))

    def targets(self) -> dict[str, Any]:
        path = self.out / "targets.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def update_targets(self, workload: str) -> dict[str, Any]:
        """Targets of ``workload`` from every reference run in the folder (``targets_of``),
        written to targets.json."""
        entry = targets_of([r for r in self.runs
                            if r["workload"] == workload and r["group"] == "reference"])
        return self.write_targets(workload, entry)

    def write_targets(self, workload: str, entry: dict[str, Any]) -> dict[str, Any]:
        targets = {**self.targets(), workload: entry}
        (self.out / "targets.json").write_text(json.dumps(targets, indent=1))
        return entry

    def write_report(self) -> None:
        lines = ["# Time to quality: results", "",
                 "Times are seconds from launch (imports, data, GPU set-up included) to the first "
                 "trial at or below the target; a run that never got there counts as the budget "
                 "(censored, marked >=). Speedup = baseline time / our time over seeds paired by "
                 "number (> 1: ours faster): the median ratio (a pair with both censored counts 1), "
                 "a distribution-free 95 % interval for the median ([-] below 6 pairs), the pairs, "
                 "the censored pairs (ours censored: ratio <=; baseline: ratio >=; both), and the "
                 "two-sided exact p-values of the sign test and of Wilcoxon's signed-rank test on "
                 "the log ratios, a pair whose order is unknown counted against the side a test "
                 "would favour (scripts/benchmarking/quality.py).", ""]
        targets = self.targets()
        groups = sorted({(r["workload"], r["group"]) for r in self.runs if r["group"] != "reference"})
        for workload, group in groups:
            if workload in targets:
                lines += self.section(workload, group)
        (self.out / "results.md").write_text("\n".join(lines) + "\n")

    def section(self, workload: str, group: str, plot: bool = True) -> list[str]:
        """The results of one workload and group: how and where they ran, each contender's
        times to the targets, and ours against each baseline (``plot``: draw its PNG)."""
        runs = [r for r in self.runs if r["workload"] == workload and r["group"] == group]
        target = self.targets()[workload]
        goals = target["targets"]
        by: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for r in runs:
            by[r["contender"]][r["seed"]] = r
        side = ("side by side on disjoint halves of the GPUs and cores (CUDA_VISIBLE_DEVICES + "
                "taskset), the halves swapped between seeds" if group.startswith("pair:")
                else "one contender at a time on the whole machine")
        if ":start" in group:  # --common-start K: its own group, never mixed with other runs
            side += (f"; every run began with the same {group.rsplit(':start', 1)[1]} random "
                     "points of the search space per seed (common random numbers)")
        used = target.get("seed_list", [])
        reference = (f"seed{'s' if len(used) > 1 else ''} {seed_text(used)}" if used
                     else f"{target['seeds']} seed(s), not recorded which")
        values = ", ".join(f"{k} {v:.5f}" for k, v in goals.items())
        # --targets-from: from kept runs of a comparison, which its note names
        source = (f"Targets (logloss): {values} ({target['note']})" if "note" in target else
                  f"Targets (logloss) from {target['contender']}'s reference run of "
                  f"{target['budget_s']:g} s ({reference}): {values}")
        lines = [f"## Workload {workload}, {group}: {side}", "", source, ""]
        for key in ("command", "commit", "source", "machine"):  # source: since 2026-11-27
            lines += [f"- {key}: " + "; ".join(sorted({f"`{r[key]}`" if key == "command"
                                                       else str(r.get(key, "not recorded"))
                                                       for r in runs}))]
        loads = [r["load_1m"] for r in runs if "load_1m" in r]
        if loads:
            lines += [f"- load average (1 min) at the launches: {min(loads):.1f} to {max(loads):.1f}"]
        lines += ["", "| contender | seeds | complete (pruned) | best value | test metric | "
                  "GPU util % | " + " | ".join(f"time to {k} s" for k in goals) + " |",
                  "|---|---:|---:|---:|---:|---:|" + "---:|" * len(goals)]
        times: dict[str, dict[str, dict[int, Censored]]] = defaultdict(dict)
        for name, seeds in sorted(by.items()):
            rs = list(seeds.values())
            # a retraining that failed says why in its "error" and counts as no test value
            test = [next(iter(r["test"].values())) for r in rs
                    if r.get("test") and "error" not in r["test"]]
            cells = []
            for k, goal in goals.items():
                times[name][k] = {s: time_to_target(r["curve"], goal, r["budget_s"])
                                  for s, r in seeds.items()}
                value, bound = median_time(list(times[name][k].values()))
                censored = sum(t.censored for t in times[name][k].values())
                cells.append(f"{'>=' if bound else ''}{value:.1f} ({censored} cens.)")
            best = _median([r["best_value"] for r in rs if r["best_value"] is not None])
            lines.append(
                f"| {name} | {len(rs)} | {_median([r['complete'] for r in rs]):.0f} "
                f"({_median([r['pruned'] for r in rs]):.0f}) | "
                f"{'-' if best is None else f'{best:.5f}'} | "
                f"{'-' if not test else f'{_median(test):.5f}'} | "
                f"{_median([r['gpu_util_mean'] for r in rs]):.0f} | " + " | ".join(cells) + " |")
        failed = [f"{r['contender']} seed {r['seed']} (exit {r['early_failures']})"
                  for r in runs if r.get("early_failures")]
        if failed:
            lines += ["", "**Runs with a process that failed before the budget** (see its "
                      "process-N.log): " + ", ".join(failed)]
        lines += ["", "Speedup (baseline time / ours): median [95 % interval], pairs; censored "
                  "ours / baseline / both; two-sided p, sign / signed-rank", "",
                  "| ours | baseline | seeds | " + " | ".join(goals) + " |",
                  "|---|---|---|" + "---|" * len(goals)]
        # An ablation pair (two of ours, no Optuna baseline) compares the variant with `ours`;
        # the package as it was before an issue (ours-before*) is the baseline of today's.
        bases = [n for n in sorted(times) if not n.startswith("ours") or
                 n.startswith("ours-before")] or [n for n in ("ours",) if n in times]
        for ours in [n for n in sorted(times) if n.startswith("ours") and n not in bases]:
            for base in bases:
                paired = sorted(set(by[ours]) & set(by[base]))
                if not paired:
                    continue
                cells = [speedup_cell(compare([times[ours][k][s] for s in paired],
                                              [times[base][k][s] for s in paired]))
                         for k in goals]
                lines.append(f"| {ours} | {base} | {seed_text(paired)} | " + " | ".join(cells) + " |")
        png = self._plot(workload, group, by, goals) if plot else _png_name(workload, group)
        return [*lines, "", f"![anytime curves]({png})", ""]

    def _plot(self, workload: str, group: str, by: dict[str, dict[int, dict[str, Any]]],
              goals: dict[str, float]) -> str:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        budget = max(r["budget_s"] for seeds in by.values() for r in seeds.values())
        grid = list(np.linspace(0, budget, 200))
        fig, ax = plt.subplots(figsize=(8, 5))
        finite = []
        for name, seeds in sorted(by.items()):
            band = quartile_band([r["curve"] for r in seeds.values()], grid)
            line, = ax.step(grid, band[1], where="post", label=f"{name} (n={len(seeds)})")
            ax.fill_between(grid, band[0], band[2], step="post", alpha=0.2, color=line.get_color())
            finite += [value_at(r["curve"], budget) for r in seeds.values()]
        for k, v in goals.items():
            if not np.isfinite(v):
                continue
            ax.axhline(v, color="grey", lw=0.8, ls="--")
            ax.annotate(f"target {k}", (budget, v), fontsize=7, ha="right", va="bottom")
        top = [v for v in [*finite, *goals.values()] if np.isfinite(v)]
        if top:
            ax.set_ylim(min(top) - 0.002, max(top) + 0.02)
        ax.set_xlabel("seconds since launch")
        ax.set_ylabel("best validation value so far (median, quartile band)")
        ax.set_title(f"workload {workload}, {group}")
        ax.legend(fontsize=8)
        name = _png_name(workload, group)
        fig.savefig(self.out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return name


def _png_name(workload: str, group: str) -> str:
    return f"curves-{workload}-{group.replace(':', '-').replace('+', '-')}.png"
