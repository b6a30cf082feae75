"""The benchmark's results folder: results.json (every run, appended across calls),
targets.json (from the reference runs), results.md (the tables) and one PNG of anytime
curves per workload and group. Pure bookkeeping over quality.py's arithmetic."""

from __future__ import annotations

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
    median_time,
    paired_speedup,
    quartile_band,
    targets_from_curve,
    time_to_target,
    value_at,
)

__all__ = ["Store", "commit", "source_trees"]

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


class Store:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out / "results.json"
        self.runs: list[dict[str, Any]] = (json.loads(self.path.read_text())["runs"]
                                           if self.path.exists() else [])

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
        """Targets of ``workload`` from every reference run in the folder: per baseline, the
        median over its reference seeds of the best value at 10/50/100 % of the budget; the
        best baseline (lowest at 100 %) gives the targets."""
        per: dict[str, list[dict[str, float]]] = defaultdict(list)
        budget = 0.0
        for r in self.runs:
            if r["workload"] == workload and r["group"] == "reference":
                per[r["contender"]].append(targets_from_curve(r["curve"], r["budget_s"]))
                budget = r["budget_s"]
        medians = {name: {k: float(np.median([t[k] for t in ts])) for k in ts[0]}
                   for name, ts in per.items()}
        best = min(medians, key=lambda n: medians[n]["100%"])
        entry = {"contender": best, "budget_s": budget, "targets": medians[best],
                 "seeds": len(per[best]), "all": medians}
        targets = {**self.targets(), workload: entry}
        (self.out / "targets.json").write_text(json.dumps(targets, indent=1))
        return entry

    def write_report(self) -> None:
        lines = ["# Time to quality: results", "",
                 "Times are seconds from launch (imports, data, GPU set-up included) to the first "
                 "trial at or below the target; a run that never got there counts as the budget "
                 "(censored, marked >=). Speedup = baseline time / our time over seeds paired by "
                 "number (> 1: ours faster), median and 95 % bootstrap interval (10,000 resamples of "
                 "the pairs); the censored pairs are counted: ours censored (ratio <=), baseline "
                 "censored (ratio >=), both (ratio 1).", ""]
        targets = self.targets()
        groups = sorted({(r["workload"], r["group"]) for r in self.runs if r["group"] != "reference"})
        for workload, group in groups:
            runs = [r for r in self.runs if r["workload"] == workload and r["group"] == group]
            if workload in targets:
                lines += self._section(workload, group, runs, targets[workload])
        (self.out / "results.md").write_text("\n".join(lines) + "\n")

    def _section(self, workload: str, group: str, runs: list[dict[str, Any]],
                 target: dict[str, Any]) -> list[str]:
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
        lines = [f"## Workload {workload}, {group}: {side}", "",
                 f"Targets (logloss) from {target['contender']}'s reference run of "
                 f"{target['budget_s']:g} s ({target['seeds']} seed(s)): "
                 + ", ".join(f"{k} {v:.5f}" for k, v in goals.items()), ""]
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
        lines += ["", "Speedup (baseline time / ours), median [95 % CI], pairs; censored: ours / "
                  "baseline / both", "", "| ours | baseline | " + " | ".join(goals) + " |",
                  "|---|---|" + "---|" * len(goals)]
        # An ablation pair (two of ours, no Optuna baseline) compares the variant with `ours`.
        bases = [n for n in sorted(times) if not n.startswith("ours")] or \
            [n for n in ("ours",) if n in times]
        for ours in [n for n in sorted(times) if n.startswith("ours") and n not in bases]:
            for base in bases:
                paired = sorted(set(by[ours]) & set(by[base]))
                if not paired:
                    continue
                cells = []
                for k in goals:
                    ci = paired_speedup([times[ours][k][s] for s in paired],
                                        [times[base][k][s] for s in paired])
                    cells.append(f"{ci.median:.2f} [{ci.low:.2f}, {ci.high:.2f}], n={ci.pairs}; "
                                 f"{ci.ours_censored}/{ci.baseline_censored}/{ci.both_censored}")
                lines.append(f"| {ours} | {base} | " + " | ".join(cells) + " |")
        png = self._plot(workload, group, by, goals)
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
        name = f"curves-{workload}-{group.replace(':', '-').replace('+', '-')}.png"
        fig.savefig(self.out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return name
