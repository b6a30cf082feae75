#!/usr/bin/env python3
"""Benchmark: CPU cost of the telemetry sampler.

Watches K live processes (each with a child, like a DataLoader worker) for D seconds at the
given interval, with the host's GPU backend (NVML where there is one; no GPU otherwise), and
reports the sampler thread's own CPU time as a share of one core. On a host with NVML it
then times each NVML call the sampler makes (``--nvml-calls`` reads per GPU), the
per-process utilization call above all: it is known to be slow on some drivers, and the
backend calls it less often when it is (gpu/_nvml.py, _PROC_UTIL_SHARE).

Usage: python scripts/bench_sampler.py [--trials 8] [--seconds 30] [--interval 1.0]
       [--nvml-calls 200]
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
    parser.add_argument("--nvml-calls", type=int, default=200,
                        help="reads per NVML call and GPU for the call-cost table (0: skip)")
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
    if args.nvml_calls and backend.name == "nvml":
        nvml_call_costs(args.nvml_calls)
    return 0


def nvml_call_costs(reps: int) -> None:
    """Mean and worst microseconds per call of each NVML function the sampler uses, per GPU.
    The per-process calls cost most while processes compute on the GPU: run this beside a
    study (e.g. during `make bench-packing`) for the figure that matters."""
    import pynvml

    pynvml.nvmlInit()
    calls = {
        "nvmlDeviceGetUtilizationRates": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetMemoryInfo": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetPowerUsage": lambda h: pynvml.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTemperature": lambda h: pynvml.nvmlDeviceGetTemperature(
            h, pynvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetComputeRunningProcesses":
            lambda h: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetProcessUtilization": lambda h: pynvml.nvmlDeviceGetProcessUtilization(h, 0),
    }
    print(f"NVML driver {pynvml.nvmlSystemGetDriverVersion()}: microseconds per call "
          f"({reps} calls per GPU; errors such as NOT_FOUND count as calls)")
    print("| GPU | call | mean µs | max µs |")
    print("|---:|---|---:|---:|")
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for name, call in calls.items():
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                try:
                    call(handle)
                except pynvml.NVMLError:
                    pass
                times.append(time.perf_counter() - start)
            print(f"| {index} | {name} | {1e6 * sum(times) / len(times):.0f} | {1e6 * max(times):.0f} |")


if __name__ == "__main__":
    sys.exit(main())
