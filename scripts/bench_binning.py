"""What binning the data once per worker saves: the built-in LightGBM objective on the CPU,
its Datasets kept for every trial of the process (today) against new ones per trial (before).

Both run the same trials (a seeded random sampler, no pruner) in this process on the
generated data of the `make hpo` study (or ``--rows``), alternating ``--repeats`` times so
that drift on a shared machine hits both; the best values must be equal (on the generated
data LightGBM's pre-filter drops no feature, so the models are the same).

    python scripts/bench_binning.py --rows 40000 400000 --trials 40 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import optuna

from hpo_orchestrator.config import LightGBMObjectiveConfig
from hpo_orchestrator.objectives.lightgbm import LightGBMObjective


class _BinnedPerTrial(LightGBMObjective):
    """The objective as it was: new Datasets for every trial, LightGBM's defaults."""

    def _datasets(self, params: dict[str, Any]) -> tuple[Any, Any]:
        return self._bin({})


def _seconds_per_trial(kind: type[LightGBMObjective], rows: int, trials: int) -> tuple[float, float]:
    objective = kind(LightGBMObjectiveConfig(n_rows=rows))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1),
                                pruner=optuna.pruners.NopPruner())
    start = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return (time.perf_counter() - start) / trials, study.best_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[40000])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["HPO_NUM_THREADS"] = str(args.threads)  # slot_info() outside a worker
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| rows | trials | threads | per trial, binned per trial (s) | binned once (s) | saved |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rows in args.rows:
        times: dict[str, list[float]] = {"per trial": [], "once": []}
        for _ in range(args.repeats):
            before, best_before = _seconds_per_trial(_BinnedPerTrial, rows, args.trials)
            after, best_after = _seconds_per_trial(LightGBMObjective, rows, args.trials)
            if best_before != best_after:
                raise SystemExit(f"error: {rows} rows: best {best_before} binned per trial, "
                                 f"{best_after} binned once: not the same models")
            times["per trial"].append(before)
            times["once"].append(after)
        before, after = (statistics.median(times[k]) for k in ("per trial", "once"))
        print(f"| {rows:,} | {args.trials} | {args.threads} | {before:.3f} | {after:.3f} "
              f"| {1 - after / before:.0%} |")


if __name__ == "__main__":
    main()
