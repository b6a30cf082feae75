"""How well does ``objective.device=auto`` predict a LightGBM trial's time on each learner?

The product measures each learner for ``CALIBRATION_ROUNDS`` rounds on the study's data and
extrapolates to a whole trial (objectives/_device.py). This probe does what a worker does, in
one process pinned to one GPU: generate the data, bin the CPU learner's Datasets, measure
each learner several times in a row, one training of ``CALIBRATION_ROUNDS`` each timed as
the product times it (``timed_run``), then train whole
trials of ``--rounds`` rounds on each learner, for a few points of the built-in search space
drawn at random. Per point and learner it prints every measurement's estimate of a whole
trial and the whole trial's real time, so one reads off whether the first measurement in a
process differs from later ones, and how far an estimate is from the truth. The Datasets are
kept per learner as the product keeps them; each CUDA trial is trained once more on new
Datasets (binned in the training, as before), for the time that saves and the check that
the model's validation loss is the same.

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
    from hpo_orchestrator.objectives._device import CALIBRATION_ROUNDS, cuda_learner_available, timed_run
    from hpo_orchestrator.objectives._generated import binary_classification
    from hpo_orchestrator.objectives._suggest import suggest_all

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
    kept: dict[str, tuple[Any, Any]] = {}
    fresh = False  # True: new Datasets for a training (the way before they were kept per learner)
    last_loss: list[float] = []

    def datasets(params: dict[str, Any]) -> tuple[Any, Any]:
        learner = params["device_type"]
        if fresh:
            train = lgb.Dataset(x_train, y_train, params={"max_bin": cfg.max_bin})
            return train, lgb.Dataset(x_valid, y_valid, reference=train)
        if learner not in kept:  # once per learner, as the product's objective keeps them
            fixed = {**base, "device_type": learner, "feature_pre_filter": False}
            if learner == "cuda":
                fixed["gpu_device_id"] = 0
            train = lgb.Dataset(x_train, y_train, params=fixed, free_raw_data=False)
            valid = lgb.Dataset(x_valid, y_valid, reference=train, params=fixed,
                                free_raw_data=False)
            valid.construct()
            kept[learner] = (train, valid)
        return kept[learner]

    def train(params: dict[str, Any], n_rounds: int, tick: Any) -> None:
        train_set, valid_set = datasets(params)
        booster = lgb.train(params, train_set, num_boost_round=n_rounds, valid_sets=[valid_set],
                            callbacks=[tick])
        last_loss.append(float(booster.best_score["valid_0"]["binary_logloss"]))

    bin_start = time.perf_counter()
    datasets({**base, "device_type": "cpu"})  # untimed in the product (its ``prepare``)
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
            row = {"event": "point", "point": point, "learner": name,
                   "num_leaves": suggested.get("num_leaves"),
                   "max_depth": suggested.get("max_depth"), "measured": estimates,
                   "whole_trial_s": whole.estimate_s(rounds), "loss": last_loss[-1]}
            if name == "cuda":  # the same trial on new Datasets: the saving, and the same model?
                fresh = True
                row["whole_trial_fresh_datasets_s"] = timed_run(
                    name, train, params, rounds).estimate_s(rounds)
                row["loss_fresh_datasets"] = last_loss[-1]
                fresh = False
            events.append(row)
            print(json.dumps(row), flush=True)
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
