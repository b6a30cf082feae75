#!/usr/bin/env python3
"""Benchmark: CPU cost of the telemetry sampler.

Watches K live processes (each with a child, like a DataLoader worker) for D seconds at the
given interval, with the host's GPU backend (NVML where there is one; no GPU otherwise), and
reports the sampler thread's own CPU time as a share of one core.

Usage: python scripts/bench_sampler.py [--trials 8] [--seconds 30] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

from hpo_orchestrator.gpu import open_backend
from hpo_orchestrator.telemetry import TelemetrySampler

CHILD = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', " \
        "'import time; time.sleep(3600)']); time.sleep(3600)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    backend = open_backend()
    gpus = backend.gpus()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True)
             for _ in range(args.trials)]
    try:
        time.sleep(1.0)
        sampler = TelemetrySampler(backend, args.interval)
        for slot, proc in enumerate(procs):
            sampler.watch(slot, trial_id=slot, pid=proc.pid,
                          gpu_index=gpus[slot % len(gpus)].index if gpus else None)
        sampler.start()
        time.sleep(args.seconds)
        sampler.stop()
        rows = len(sampler.take_rows())
    finally:
        for proc in procs:
            os.killpg(proc.pid, 9)
            proc.wait()
        backend.close()
    share = sampler.cpu_seconds / args.seconds
    per_sample_ms = 1000 * sampler.cpu_seconds / max(sampler.samples_taken, 1)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, GPU backend {backend.name} "
          f"({len(gpus)} GPUs); command: python scripts/bench_sampler.py --trials {args.trials} "
          f"--seconds {args.seconds:g} --interval {args.interval:g}")
    print("| trials watched | interval s | rounds | rows | CPU ms per round | share of one core |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.trials} | {args.interval:g} | {sampler.samples_taken} | {rows} | "
          f"{per_sample_ms:.2f} | {share:.3%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
