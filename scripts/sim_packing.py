"""Replay trials_per_gpu=auto's rules (placement/_rules.py) on a simulated GPU: cheap
evidence for a rule change before GPU time is spent on scripts/bench_packing.py.

One GPU, trials enqueued in a fixed order of kinds. A trial's work (seconds alone, times
log-normal noise) progresses at ``gain(n) / n`` per second while n trials share the GPU; a
worker's first trial of each kind first pays a warm-up (imports, CUDA context, kernel build)
that slows its neighbours to 0.7x meanwhile. The gains and warm-ups are calibrated on the
H100 runs of docs/BENCHMARKS.md (issue 17): gpu_mix 1.62x at two per GPU, 2.1x at three,
2.0x at four; LightGBM trials of 3.4 s with a 8 s warm-up, and 0.65x or 0.91x at two.

    python scripts/sim_packing.py --trials 100 --seeds 10

prints, per workload, the fixed levels' mean makespan and auto's ratio to the best of them
(mean and worst over the seeds), with one seed's level changes. It models no CPU contention,
no memory and no utilization (a nearly idle GPU is assumed): it compares rules, not hosts.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpo_orchestrator.placement._rules import (
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    decide,
)
from hpo_orchestrator.placement._trial_times import TrialTimes

DT = 0.05  # simulated seconds per step
SPAWN_S = 2.0  # a new worker's process start before it takes a trial


@dataclass(frozen=True)
class Workload:
    name: str
    kinds: tuple[str, ...]  # enqueued in this order, round and round
    seconds: dict[str, float]  # a trial's time alone
    warmup: dict[str, float]  # its first run in a worker costs this much more
    gain: dict[int, float]  # throughput at n trials at once over one


LGBM, TORCH = "lightgbm", "torch"
WORKLOADS = {
    "gpu_mix": Workload("gpu_mix", (LGBM, TORCH), {LGBM: 3.4, TORCH: 8.0},
                        {LGBM: 8.0, TORCH: 11.0}, {1: 1.0, 2: 1.62, 3: 2.1, 4: 2.0}),
    "lightgbm_091": Workload("lightgbm_091", (LGBM,), {LGBM: 3.4}, {LGBM: 8.0},
                             {1: 1.0, 2: 0.91, 3: 0.82, 4: 0.73}),
    "lightgbm_065": Workload("lightgbm_065", (LGBM,), {LGBM: 3.4}, {LGBM: 8.0},
                             {1: 1.0, 2: 0.65, 3: 0.6, 4: 0.5}),
}


@dataclass
class _Trial:
    kind: str
    work: float
    warm: float
    start: float
    worker: int


def simulate(load: Workload, fixed: int | None, trials: int, seed: int,
             noise: float = 0.2) -> tuple[float, list[tuple[float, int]]]:
    """Makespan of ``trials`` at a fixed level (``fixed``) or auto, and auto's level changes."""
    rng = random.Random(seed)
    policy = PackingPolicy()
    queue = [load.kinds[i % len(load.kinds)] for i in range(trials)]
    workers: dict[int, dict] = {}  # id -> {"seen": kinds run, "busy": trial, "ready": time}
    times = TrialTimes(reuse=True)
    state = GpuLevel(gpu=0, limit=fixed or 1, since=0.0, ceiling=policy.max_per_gpu)
    running: list[_Trial] = []
    now, done, decided, next_id = 0.0, 0, -1.0, 1
    changes = [(0.0, state.limit)]
    while done < trials:
        for wid in [w for w, d in workers.items() if d["busy"] is None][state.limit:]:
            if len(workers) > state.limit:  # over the level: idle workers retire
                del workers[wid]
        while len(workers) < state.limit:
            workers[next_id] = {"seen": set(), "busy": None, "ready": now + SPAWN_S}
            next_id += 1
        for wid, w in workers.items():
            if w["busy"] is None and w["ready"] <= now and queue and len(running) < state.limit:
                kind = queue.pop(0)
                trial = _Trial(kind, load.seconds[kind] * math.exp(rng.gauss(0, noise)),
                               0.0 if kind in w["seen"] else load.warmup[kind], now, wid)
                w["busy"] = trial
                running.append(trial)
        n = len(running)
        rate = load.gain.get(n, 0.5) / n if n else 0.0
        slowed = 0.7 if any(t.warm > 0 for t in running) else 1.0
        for t in running:
            if t.warm > 0:
                t.warm -= DT
            else:
                t.work -= DT * rate * slowed
        now += DT
        for t in [t for t in running if t.warm <= 0 and t.work <= 0]:
            running.remove(t)
            done += 1
            workers[t.worker]["busy"] = None
            times.ended(times.span(0, t.worker, {"kind": t.kind}, t.start, now))
            workers[t.worker]["seen"].add(t.kind)
        if fixed is None and now - decided >= 1.0:
            decided = now
            spans = [times.span(0, t.worker, {"kind": t.kind}, t.start) for t in running]
            obs = GpuObservation(gpu=0, running=len(running), util=8.0 * max(1, len(running)),
                                 readings=10, free_mib=70_000.0,
                                 running_mem_mib=(1000.0,) * len(running),
                                 trials=times.measured(0, state.since, spans, now), cpu_cores=2.0)
            host = HostObservation(cores=16, concurrency=state.limit, cap=64, mem_peak_mib=2000.0)
            state, change = decide(policy, state, obs, host, now)
            if change is not None:
                changes.append((round(now, 1), change.new))
    return now, changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100, help="trials per run")
    parser.add_argument("--seeds", type=int, default=10, help="runs per setting")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)
    for name in args.workloads.split(","):
        load = WORKLOADS[name]
        seeds = range(args.seeds)
        fixed = {k: statistics.fmean(simulate(load, k, args.trials, s)[0] for s in seeds)
                 for k in (1, 2, 3, 4)}
        best = min(fixed, key=fixed.__getitem__)
        runs = [simulate(load, None, args.trials, s) for s in seeds]
        ratios = [fixed[best] / span for span, _ in runs]
        print(f"{name}: fixed " + ", ".join(f"{k}: {v:.1f} s" for k, v in fixed.items())
              + f"; auto {statistics.fmean(ratios):.2f}x of fixed {best} (worst "
              f"{min(ratios):.2f}x); seed 0 levels "
              + " -> ".join(str(level) for _, level in runs[0][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
