"""How well does ``objective.device=auto`` predict a LightGBM trial's time on each learner?

The product measures each learner for ``CALIBRATION_ROUNDS`` rounds on the study's data and
extrapolates to a whole trial (objectives/_device.py). This probe does what a worker does, in
one process pinned to one GPU: generate the data, bin the CPU learner's Datasets, measure
each learner several times in a row, one training of ``CALIBRATION_ROUNDS`` each timed as
the product times it (``timed_run``), then train whole
trials of ``--rounds`` rounds on each learner, for a few points of the built-in search space
drawn at random. Per point and learner it prints every measurement's estimate of a whole
trial and the whole trial's real time, so one reads off whether the first measurement in a
process differs from later ones, and how far an estimate is from the truth.

    CUDA_VISIBLE_DEVICES=0 python scripts/probe_device_choice.py --rows 1000000 --threads 11 --out probe.json

Needs a LightGBM built with its CUDA learner for the CUDA rows (docs/QUALITY.md, workload b);
without one, the CUDA rows say why and the CPU rows still run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def probe(rows: int, threads: int, points: int, repeat: int, rounds: int,
          seed: int) -> list[dict[str, Any]]:
    import lightgbm as lgb
    import optuna

    from hpo_orchestrator.config import LIGHTGBM_SPACE, LightGBMObjectiveConfig
    from hpo_orchestrator.objectives._data import binary_classification
    from hpo_orchestrator.objectives._device import CALIBRATION_ROUNDS, cuda_learner_available, timed_run
    from hpo_orchestrator.objectives._space import suggest_all

    cfg = LightGBMObjectiveConfig(n_rows=rows)
    started = time.perf_counter()
    x_train, y_train, x_valid, y_valid = binary_classification(cfg.n_rows, cfg.n_features,
                                                               cfg.seed)
    events: list[dict[str, Any]] = [{"event": "data", "s": time.perf_counter() - started}]
    check_start = time.perf_counter()
    cuda, why = cuda_learner_available()
    events.append({"event": "cuda_check", "available": cuda, "why": why,
                   "s": time.perf_counter() - check_start})
    base = {"objective": "binary", "metric": "binary_logloss", "verbosity": -1,
            "num_threads": threads, "max_bin": cfg.max_bin, "seed": cfg.seed, "bagging_freq": 1}
    cpu_datasets: tuple[Any, Any] | None = None

    def datasets(params: dict[str, Any]) -> tuple[Any, Any]:
        nonlocal cpu_datasets
        if params["device_type"] != "cpu":  # a GPU learner bins per trial, as the product's
            train = lgb.Dataset(x_train, y_train, params={"max_bin": cfg.max_bin})
            return train, lgb.Dataset(x_valid, y_valid, reference=train)
        if cpu_datasets is None:  # binned once per process, untimed, as the product's
            kept = {**base, "device_type": "cpu", "feature_pre_filter": False}
            train = lgb.Dataset(x_train, y_train, params=kept, free_raw_data=False)
            valid = lgb.Dataset(x_valid, y_valid, reference=train, params=kept,
                                free_raw_data=False)
            valid.construct()
            cpu_datasets = (train, valid)
        return cpu_datasets

    def train(params: dict[str, Any], n_rounds: int, tick: Any) -> None:
        train_set, valid_set = datasets(params)
        lgb.train(params, train_set, num_boost_round=n_rounds, valid_sets=[valid_set],
                  callbacks=[tick])

    bin_start = time.perf_counter()
    datasets({**base, "device_type": "cpu"})
    events.append({"event": "cpu_binning", "s": time.perf_counter() - bin_start})
    learners = {"cpu": {"device_type": "cpu"}}
    if cuda:
        learners["cuda"] = {"device_type": "cuda", "gpu_device_id": 0}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for point in range(points):
        suggested = suggest_all(study.ask(), LIGHTGBM_SPACE)
        for name, device in learners.items():
            params = {**base, **suggested, **device}
            estimates = []
            for _ in range(repeat):  # one training each: the product takes a GPU's faster two
                timing = timed_run(name, train, params, CALIBRATION_ROUNDS)
                estimates.append({"s_per_round": timing.s_per_round,
                                  "overhead_s": timing.overhead_s,
                                  "estimate_s": timing.estimate_s(rounds)})
            whole = timed_run(name, train, params, rounds)
            events.append({"event": "point", "point": point, "learner": name,
                           "num_leaves": suggested.get("num_leaves"),
                           "max_depth": suggested.get("max_depth"), "measured": estimates,
                           "whole_trial_s": whole.estimate_s(rounds)})
            print(json.dumps(events[-1]), flush=True)
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=11)
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="measurements per learner and point")
    parser.add_argument("--rounds", type=int, default=200, help="a whole trial's rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    events = probe(args.rows, args.threads, args.points, args.repeat, args.rounds, args.seed)
    if args.out:
        args.out.write_text(json.dumps(events, indent=1))


if __name__ == "__main__":
    main()
