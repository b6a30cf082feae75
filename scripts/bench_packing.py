#!/usr/bin/env python3
"""Benchmark: trials per minute at 1, 2, 3, 4 trials per GPU and with trials_per_gpu=auto.

The same fixed workload for every setting, run by ``hpo-orchestrator run`` in its own
process on every GPU of the host (``scheduler.parallel=auto``):

- ``gpu_mix``: scripts/bench_gpu.py's trials, half LightGBM on the GPU (400k rows, 200
  rounds), half a torch MLP (200k samples, 4 epochs), fixed hyperparameters, enqueued; its
  ``objective.setup`` imports torch and LightGBM and makes the CUDA context, as a user's
  module would (before round 4 of docs/BENCHMARKS.md each worker's first trials did that);
- ``lightgbm``: the default LightGBM objective (400k rows, 200 rounds) with the same fixed
  parameters enqueued for every trial (TPE would make the trials differ between settings).

Pruning is off, so every trial does the same work. For each run: trials per minute (trials
COMPLETE over the span from the first start to the last end), each GPU's busy share (its
utilization > 0) and mean utilization while the run lasted (read every 0.2 s through the
product's own GPU backend: NVML, or the fake one), OOM failures, and for auto its levels and
changes (hpo.packing.<host>). Progress goes to stdout; results.json and results.md are
written to --out after every run, so a run cut short keeps what it measured.

On a GPU host (offline, the wheelhouse installed as scripts/gpu_host_check.sh does):
    PYTHONPATH=$PWD:/tmp/hpo-site python3 scripts/bench_packing.py --out bench-packing-1gpu
It sizes itself to ~8 minutes on one H100 (12 trials per GPU per run, 10 runs). A dry run of
the script itself on a CPU machine, on scripted fake GPUs at 30 % utilization:
    python scripts/bench_packing.py --scale 0.02 --fake-gpus 1 --out /tmp/bench-packing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _checkout import on_path

on_path()  # the test objectives (tests/objectives/__init__.py), here and in the study's processes

SETTINGS = {"1": ["scheduler.trials_per_gpu=1"], "2": ["scheduler.trials_per_gpu=2"],
            "3": ["scheduler.trials_per_gpu=3"], "4": ["scheduler.trials_per_gpu=4"],
            "auto": ["scheduler.trials_per_gpu=auto"]}
# Seconds per trial alone on one H100 (issue 17's sweep), for the time estimate only.
SOLO_S = {"gpu_mix": 5.3, "lightgbm": 3.3}


class GpuWatch(threading.Thread):
    """Every GPU's utilization and memory every 0.2 s, through the product's backend."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        from hpo_orchestrator.gpu import open_backend

        self.backend = open_backend()
        self.gpus = [g.index for g in self.backend.gpus()]
        self.samples: list[tuple[float, dict[int, float | None]]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            readings = {}
            for index in self.gpus:
                sample = self.backend.sample(index)
                readings[index] = None if sample is None else sample.sm_util
            self.samples.append((time.time(), readings))

    def summary(self, lo: float, hi: float) -> dict[str, dict[str, float | None]]:
        window = [r for t, r in self.samples if lo <= t <= hi]
        out = {}
        for index in self.gpus:
            utils = [r[index] for r in window if r.get(index) is not None]
            out[f"gpu{index}"] = {
                "busy": round(sum(1 for u in utils if u and u > 0) / len(utils), 3) if utils else None,
                "util_mean": round(sum(u for u in utils if u is not None) / len(utils), 1)
                if utils else None}
        return out


def workload(name: str, n: int, scale: float) -> tuple[list[dict[str, Any]], list[str]]:
    """(params to enqueue, overrides) of a workload."""
    from tests.objectives import GPU_MIX_PARAMS

    if name == "gpu_mix":
        return ([{"kind": "lightgbm" if i % 2 == 0 else "torch"} for i in range(n)],
                ["objective=custom", "objective.target=tests.objectives:gpu_mix",
                 "objective.setup=tests.objectives:gpu_mix_setup"])
    return ([dict(GPU_MIX_PARAMS["lightgbm"]) for _ in range(n)],
            ["objective=lightgbm", f"objective.n_rows={max(1000, int(400_000 * scale))}",
             "objective.num_boost_round=200"])


def run_one(work: Path, out: Path, name: str, setting: str, n: int, scale: float,
            watch: GpuWatch, env: dict[str, str]) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = work / f"{name}-{setting}.db"
    url = f"sqlite:///{db}"
    params, overrides = workload(name, n, scale)
    study = optuna.create_study(study_name="bench", storage=url)
    for p in params:
        study.enqueue_trial(p)
    log = out / f"{name}-{setting}.log"
    command = [sys.executable, "-m", "hpo_orchestrator", "run", *overrides,
               "scheduler.parallel=auto", *SETTINGS[setting], f"study.n_trials={n}",
               "study.name=bench", "pruner=none", f"storage.url={url}"]
    start = time.time()
    with log.open("w") as handle:
        code = subprocess.run(command, cwd=work, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    end = time.time()
    with sqlite3.connect(db) as con:
        lo, hi, done = con.execute("SELECT MIN(datetime_start), MAX(datetime_complete), COUNT(*) "
                                   "FROM trials WHERE state = 'COMPLETE'").fetchone()
        ooms = con.execute("SELECT COUNT(*) FROM trial_user_attributes WHERE key = "
                           "'hpo.fail_reason' AND value_json = '\"oom\"'").fetchone()[0]
        fails = con.execute("SELECT COUNT(*) FROM trials WHERE state = 'FAIL'").fetchone()[0]
        packing = [json.loads(v) for (v,) in con.execute(
            "SELECT value_json FROM study_user_attributes WHERE key LIKE 'hpo.packing.%'")]
    span = (datetime.fromisoformat(hi) - datetime.fromisoformat(lo)).total_seconds() if done else None
    auto = packing[0] if packing and packing[0].get("mode") == "auto" else None
    return {"workload": name, "setting": setting, "exit_code": code, "trials": n,
            "complete": done, "failed": fails, "oom": ooms, "span_s": span and round(span, 2),
            "wall_s": round(end - start, 2),
            "trials_per_min": round(done / span * 60, 2) if span else None,
            "gpus": watch.summary(start, end),
            "auto_levels": None if auto is None else {f"gpu{lv['gpu']}": lv["limit"]
                                                      for lv in auto["levels"]},
            "auto_changes": None if auto is None else auto["changes"],
            # why each GPU stopped where it did, its measured gains, utilization and CPU use
            "auto_final": None if auto is None else auto["levels"],
            "mps": packing[0].get("mps") if packing else None, "log": log.name}


def markdown(results: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| workload | trials per GPU | trials/min | vs 1 per GPU | span s | "
             "OOM | GPU busy | GPU util mean | auto levels |", "|---|---|---:|---:|---:|---:|---|---|---|"]
    base = {r["workload"]: r["trials_per_min"] for r in results if r["setting"] == "1"}
    for r in results:
        ratio = (f"{r['trials_per_min'] / base[r['workload']]:.2f}x"
                 if r["trials_per_min"] and base.get(r["workload"]) else "-")
        busy = ", ".join(f"{g} {v['busy']:.0%}" for g, v in r["gpus"].items() if v["busy"] is not None)
        util = ", ".join(f"{g} {v['util_mean']:.0f}%" for g, v in r["gpus"].items()
                         if v["util_mean"] is not None)
        levels = ", ".join(f"{g}: {n}" for g, n in (r["auto_levels"] or {}).items()) or "-"
        lines.append(f"| {r['workload']} | {r['setting']} | {r['trials_per_min'] or '-'} | {ratio} | "
                     f"{r['span_s'] or '-'} | {r['oom']} | {busy or '-'} | {util or '-'} | {levels} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for results and logs")
    parser.add_argument("--trials-per-gpu", type=int, default=12,
                        help="trials per run and GPU (the whole run: this x GPUs)")
    parser.add_argument("--settings", default="1,2,3,4,auto")
    parser.add_argument("--workloads", default="gpu_mix,lightgbm")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="data size factor (< 1: a quick dry run on a CPU machine)")
    parser.add_argument("--fake-gpus", type=int, default=0,
                        help="run on N scripted fake GPUs at 30%% utilization (a dry run)")
    args = parser.parse_args()
    settings = args.settings.split(",")
    workloads = args.workloads.split(",")
    bad = [s for s in settings if s not in SETTINGS] + [w for w in workloads if w not in SOLO_S]
    if bad:
        print(f"error: unknown setting or workload: {', '.join(bad)}\nhint: settings "
              f"{', '.join(SETTINGS)}; workloads {', '.join(SOLO_S)}", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPO_GPU_MIX_SCALE": str(args.scale)}
    if args.fake_gpus:
        spec = json.dumps({"gpus": [{"busy_util": 30}] * args.fake_gpus})
        env.update({"HPO_ORCHESTRATOR_FAKE_GPUS": spec,
                    "HPO_FAKE_GPU_MACHINE": f"bench-packing-{os.getpid()}"})
        os.environ.update({k: env[k] for k in ("HPO_ORCHESTRATOR_FAKE_GPUS", "HPO_FAKE_GPU_MACHINE")})
    args.out.mkdir(parents=True, exist_ok=True)
    watch = GpuWatch()
    watch.start()
    gpus = max(len(watch.gpus), 1)
    n = args.trials_per_gpu * gpus
    estimate = sum(SOLO_S[w] * args.trials_per_gpu * args.scale * (1.0 if s == "1" else 0.6) + 6
                   for w in workloads for s in settings)
    header = (f"Command: `python scripts/bench_packing.py --trials-per-gpu {args.trials_per_gpu} "
              f"--scale {args.scale:g}{f' --fake-gpus {args.fake_gpus}' if args.fake_gpus else ''}`; "
              f"{len(watch.gpus)} GPU(s) ({watch.backend.name}: "
              f"{', '.join(g.name for g in watch.backend.gpus()) or 'none'}), {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}, {datetime.now():%Y-%m-%d %H:%M}; {n} trials per run.")
    print(f"{header}\n{len(settings) * len(workloads)} runs, about {estimate / 60:.0f} min "
          f"(estimate from one-H100 solo times)", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in workloads:
            for setting in settings:
                print(f"[{time.strftime('%H:%M:%S')}] {name}, trials_per_gpu={setting} ...",
                      end=" ", flush=True)
                result = run_one(Path(tmp), args.out, name, setting, n, args.scale, watch, env)
                results.append(result)
                print(f"{result['trials_per_min']} trials/min, span {result['span_s']} s, "
                      f"{result['oom']} OOM, exit {result['exit_code']}, GPUs "
                      + ", ".join(f"{g} busy {v['busy']} util {v['util_mean']}"
                                  for g, v in result["gpus"].items())
                      + (f", auto levels {result['auto_levels']}" if result["auto_levels"] else ""),
                      flush=True)
                (args.out / "results.json").write_text(json.dumps(
                    {"header": header, "results": results}, indent=1))
                (args.out / "results.md").write_text(markdown(results, header))
    watch.halt.set()
    print(markdown(results, header))
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
