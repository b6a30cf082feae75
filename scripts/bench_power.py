#!/usr/bin/env python3
"""Power before runs (issue 54): from a baseline's kept curves in a results folder, the paired
seeds and budget a time-to-quality comparison needs to show a given speedup, and the budget
by which most of the baseline's runs reach the target. Run it before booking a machine: a
design that cannot show the effect it is run for is not evidence either way.

    python scripts/bench_power.py docs/quality-data/cpu-expert --workload a \
        --group pair:ours+optuna-cpu-t1-none --contender optuna-cpu-t1-none

prints, for ours truly ``--speedup`` (1.25) times faster at ``--target`` (50%): the power of
each number of pairs at each budget (ours called faster by both exact tests at two-sided
p < 0.05, the benchmark's rule), the fewest pairs with at least ``--power`` (80 %) at each
budget, and the Kaplan-Meier budget by which ``--reach`` (80 %) of the baseline's runs reach
the target. With ``--margin M`` the verdict is "no slower than M times the baseline's time"
(the one-sided tests at 0.025) instead. The model (whole runs resampled, ours the baseline's
curves sped up, no credit for pairing): scripts/benchmarking/power.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.benchmarking.power import (  # noqa: E402
    Run,
    pairs_needed,
    reach_budget,
    reach_share,
    simulated_power,
)
from scripts.benchmarking.quality import time_to_target  # noqa: E402
from scripts.benchmarking.tables import Store  # noqa: E402


def _numbers(text: str, kind: type) -> list:  # type: ignore[type-arg]
    return [kind(x) for x in text.split(",") if x]


def _refuse(message: str, hint: str) -> int:
    print(f"error: {message}\nhint: {hint}", file=sys.stderr)
    return 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a results folder: results.json or a kept "
                        "results.json.gz, and targets.json (docs/quality-data/FOLDER)")
    parser.add_argument("--results", default="results.json.gz", help="the kept file's name")
    parser.add_argument("--workload", default="a")
    parser.add_argument("--group", action="append", required=True,
                        help="the runs' group (repeatable: the curves of several groups)")
    parser.add_argument("--contender", required=True, help="the baseline whose curves are used")
    parser.add_argument("--target", default="50%", help="10%%, 50%% or 100%% (targets.json)")
    parser.add_argument("--speedup", type=float, default=1.25, help="ours' true speedup")
    parser.add_argument("--margin", type=float, help="test 'no slower than MARGIN x' instead")
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--reach", type=float, default=0.8, help="share of baseline runs at "
                        "the target by the budget sought")
    parser.add_argument("--pairs", default="5,10,20,40,80")
    parser.add_argument("--budgets", help="seconds, e.g. 60,90,120 (default: the runs' budgets)")
    parser.add_argument("--studies", type=int, default=400, help="simulated studies per cell")
    args = parser.parse_args()
    try:
        pairs = _numbers(args.pairs, int)
        budgets = _numbers(args.budgets, float) if args.budgets else None
    except ValueError:
        return _refuse(f"--pairs {args.pairs!r} / --budgets {args.budgets!r}: not numbers",
                       "comma-separated, e.g. --pairs 5,10,20 --budgets 60,120")
    if not pairs or min(pairs) < 1 or args.studies < 1 or args.speedup <= 0 or \
            (args.margin is not None and args.margin < 1):
        return _refuse("--pairs, --studies and --speedup must be positive, --margin >= 1",
                       "e.g. --pairs 5,10,20 --speedup 1.25 (--margin 1.1)")
    store = Store(args.folder, kept=args.results)
    targets = store.targets().get(args.workload, {}).get("targets", {})
    if args.target not in targets:
        return _refuse(f"no {args.target} target of workload {args.workload} in "
                       f"{args.folder}/targets.json", f"one of: {', '.join(targets) or 'none'}")
    runs = [Run(r["curve"], r["budget_s"]) for r in store.runs
            if r["workload"] == args.workload and r["group"] in args.group
            and r["contender"] == args.contender]
    if not runs:
        groups = sorted({r["group"] for r in store.runs if r["contender"] == args.contender})
        return _refuse(f"no runs of {args.contender} in group(s) {', '.join(args.group)}",
                       f"its groups here: {', '.join(groups) or 'none'}")
    value = targets[args.target]
    budgets = budgets or sorted({r.budget_s for r in runs})
    times = [time_to_target(r.curve, value, r.budget_s) for r in runs]
    print(f"{len(runs)} kept curves of {args.contender} ({', '.join(args.group)}), budgets "
          f"{', '.join(f'{b:.0f}' for b in sorted({r.budget_s for r in runs}))} s; target "
          f"{args.target} = {value:.5g}; reached by {sum(not t.censored for t in times)} of them")
    share = reach_share(times)
    at = reach_budget(times, args.reach)
    print("baseline runs at the target (Kaplan-Meier): "
          + ", ".join(f"{s:.0%} by {t:.0f} s" for t, s in share[-4:]))
    print(f"budget for {args.reach:.0%} of the baseline's runs at the target: "
          + (f"{at:.0f} s" if at is not None else
             f"not within the kept runs ({max(r.budget_s for r in runs):.0f} s); run longer "
             "references first"))
    verdict = (f"ours within {args.margin}x by both one-sided tests at p < 0.025"
               if args.margin else "ours faster by both two-sided tests at p < 0.05")
    print(f"\npower: ours truly {args.speedup}x faster, {verdict}; {args.studies} studies a "
          "cell (blank: no kept run lasted that budget)\n")
    print("| pairs | " + " | ".join(f"{b:.0f} s" for b in budgets) + " |")
    print("|---:|" + "---:|" * len(budgets))
    table = {b: {n: simulated_power(runs, [value], n, b, args.speedup, args.margin, args.studies)
                 for n in pairs} for b in budgets}
    for n in pairs:
        print(f"| {n} | " + " | ".join("" if table[b][n] is None else f"{table[b][n]:.0%}"
                                       for b in budgets) + " |")
    print()
    for b in budgets:
        need = pairs_needed(table[b], args.power)
        print(f"{b:.0f} s: " + (f"{need} pairs for {args.power:.0%} power" if need is not None
                                else f"more than {max(pairs)} pairs for {args.power:.0%} power"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
