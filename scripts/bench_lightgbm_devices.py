"""Where does one LightGBM training run faster: on CPU threads, or on a GPU learner?

The measurement behind `objective.device` (issue 27, docs/GPU.md "CPU or GPU for LightGBM"):
the built-in objective's generated data (objectives/_generated.py, the `make hpo` study at 40k x
40), trained with a mid-range point of its search space for ``--rounds`` rounds, on

- the CPU with 1, 2, 4, 8 and 16 threads (``device_type=cpu``);
- the GPU's OpenCL learner (``device_type=gpu``) on NVIDIA's platform, as a pinned trial
  runs it (CUDA_VISIBLE_DEVICES=0, NVIDIA's ICD added where the registry lacks it);
- the CUDA learner (``device_type=cuda``) where the LightGBM that Python imports was built
  with it.

Each measurement runs in its own process (OpenCL and the ICD are chosen at load), the data
generated there; the time is the Dataset's construction plus training, NVML's utilization of
GPU 0 sampled meanwhile. Needs NVIDIA GPUs for the GPU rows; the CPU rows run anywhere.

    python scripts/bench_lightgbm_devices.py --rows 40000 400000 2000000 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# A point in the middle of the built-in space (config/_space.py LIGHTGBM_SPACE).
PARAMS = {"objective": "binary", "metric": "binary_logloss", "verbosity": -1,
          "learning_rate": 0.05, "num_leaves": 63, "min_child_samples": 20,
          "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
          "lambda_l1": 1e-3, "lambda_l2": 1e-3, "max_bin": 63}


def _gpu_util_sampler(stop: threading.Event, readings: list[float]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return
    while not stop.wait(0.2):
        readings.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))


def measure_one(device: str, rows: int, threads: int, rounds: int) -> dict[str, Any]:
    """One training in this process: seconds and GPU 0's mean utilization meanwhile."""
    import lightgbm as lgb

    from hpo_orchestrator.objectives._generated import binary_classification

    x_train, y_train, x_valid, y_valid = binary_classification(rows, 40, seed=0)
    params = {**PARAMS, "num_threads": threads, "device_type": device}
    if device == "gpu":
        from hpo_orchestrator.gpu._opencl import list_platforms

        nvidia = [p for p in list_platforms() if p.is_nvidia]
        params.update(gpu_platform_id=nvidia[0].id if nvidia else -1, gpu_device_id=0)
    readings: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_gpu_util_sampler, args=(stop, readings), daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        train = lgb.Dataset(x_train, y_train, params={"max_bin": PARAMS["max_bin"]})
        valid = lgb.Dataset(x_valid, y_valid, reference=train)
        booster = lgb.train(params, train, num_boost_round=rounds, valid_sets=[valid])
        error = None
    except Exception as exc:  # a learner this build lacks
        booster, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    loss = None if booster is None else float(booster.best_score["valid_0"]["binary_logloss"])
    return {"device": device, "rows": rows, "threads": threads, "rounds": rounds,
            "seconds": round(seconds, 3), "gpu_util_mean": round(sum(readings) / len(readings), 1)
            if readings else None, "valid_logloss": loss, "error": error,
            "lightgbm": lgb.__version__}


def _child(device: str, rows: int, threads: int, rounds: int) -> dict[str, Any]:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    if device == "gpu":
        from hpo_orchestrator.gpu._opencl import nvidia_icd_env

        env.update(nvidia_icd_env())
    proc = subprocess.run([sys.executable, __file__, "--one", device, str(rows), str(threads),
                           str(rounds)], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        return {"device": device, "rows": rows, "threads": threads, "rounds": rounds,
                "error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[40_000, 400_000, 2_000_000])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--gpu-threads", type=int, default=4,
                        help="CPU threads beside the GPU learners (data, histogram merges)")
    parser.add_argument("--devices", nargs="+", default=["cpu", "gpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        device, rows, threads, rounds = args.one
        print(json.dumps(measure_one(device, int(rows), int(threads), int(rounds))))
        return
    results = []
    for rows in args.rows:
        for device in args.devices:
            for threads in args.threads if device == "cpu" else [args.gpu_threads]:
                result = _child(device, rows, threads, args.rounds)
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.out:
                    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
