#!/usr/bin/env python3
"""Benchmark 4: GPU makespan of one fixed LightGBM + torch workload, contenders side by side.

The workload: N trials (half LightGBM on the GPU through NVIDIA OpenCL, half a torch MLP),
each with the same fixed hyperparameters (tests.objectives:gpu_mix), the
same enqueued list for every contender, PAR=4:

- hpo-orchestrator, reuse mode and fresh mode;
- Optuna's ``study.optimize(n_jobs=4)``: threads in one process;
- a process pool of 4 that assigns GPUs round-robin and sets CUDA_VISIBLE_DEVICES inside the
  worker, per task (the incident's pattern).

Fair by construction: every contender runs the same enqueued trials with fixed params (the
sampler decides nothing), on a sqlite file (WAL, synchronous=NORMAL; Optuna's threads too, not
in-memory storage), with cores / PAR threads per trial (HPO_NUM_THREADS and OMP/MKL/OPENBLAS,
as the orchestrator sets for its children) and no telemetry (the orchestrator's is turned off).
The output says this above the table.

Lower bound: the longest trial alone on a GPU in a warm process, the faster of cores / PAR
threads and every core (measured first, one trial at a time): no schedule finishes sooner,
if sharing a GPU never makes a trial faster than running alone. Beside it, "serial per GPU":
total solo work / GPUs, what one trial at a time per GPU would take; not a bound, since PAR=4
puts 2-4 trials on a GPU at once and they may overlap profitably. Each GPU's busy fraction
(NVML utilization > 0) is sampled every 0.2 s while the contender runs.

Usage (on a GPU host): python scripts/bench_gpu.py [--trials 16] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from _checkout import on_path

on_path()  # the test objectives (tests/objectives/__init__.py), here and in the study's processes

TARGET = "tests.objectives:gpu_mix"
PAR = 4


class GpuBusy(threading.Thread):
    """Samples NVML utilization of every GPU until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:  # a CPU machine: only a dry run of the script itself
            self.handles = []
        self.samples: list[tuple[float, list[int]]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            self.samples.append((time.time(), [self.nvml.nvmlDeviceGetUtilizationRates(h).gpu
                                               for h in self.handles]))

    def busy(self, lo: float, hi: float) -> list[float]:
        window = [u for t, u in self.samples if lo <= t <= hi]
        if not window:
            return [0.0] * len(self.handles)
        return [sum(1 for u in window if u[i] > 0) / len(window) for i in range(len(self.handles))]


def workload(n: int) -> list[str]:
    return ["lightgbm" if i % 2 == 0 else "torch" for i in range(n)]


def _env() -> dict[str, str]:
    from hpo_orchestrator.gpu._opencl import nvidia_icd_env

    # The naive contenders get the NVIDIA OpenCL platform too (else LightGBM falls back to CPU)
    # and the "GPU slot" flag the built-in objectives read; they pin nothing.
    gpu = {"HPO_GPU_INDEX": "0"} if _gpu_count() else {}  # none: a dry run on a CPU machine
    return {**os.environ, **nvidia_icd_env(), **gpu, "PYTHONUNBUFFERED": "1", **_threads()}


def _threads() -> dict[str, str]:
    """cores / PAR threads per trial, as the orchestrator gives each of its children."""
    from hpo_orchestrator.placement import threads_per_trial

    threads = str(threads_per_trial(None, PAR))
    return {"HPO_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads}


def _tune_sqlite(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        for pragma in ("journal_mode=WAL", "busy_timeout=30000", "synchronous=NORMAL"):
            dbapi_connection.execute("PRAGMA " + pragma)


def _sqlite(db: Path) -> str:
    """A sqlite file tuned as the orchestrator tunes its own (hpo_orchestrator/db/connect.py)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _tune_sqlite):
        event.listen(Engine, "connect", _tune_sqlite)
    return f"sqlite:///{db}"


def _gpu_count() -> int:
    import pynvml

    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0


def _run_trial(kind: str) -> tuple[float, float]:
    import optuna

    from tests.objectives import gpu_mix

    start = time.time()
    gpu_mix(optuna.trial.FixedTrial({"kind": kind}))
    return start, time.time()


def solo_durations(kinds: list[str]) -> dict[str, float]:
    """Each kind alone on GPU 0 in a warm process (one untimed run first), the faster of
    cores / PAR threads (as in the contenders) and every core: more threads are not always
    faster, and the bound needs the fastest a trial runs alone."""
    shared = _solo_durations(kinds, every_core=False)
    alone = _solo_durations(kinds, every_core=True)
    return {kind: min(shared[kind], alone[kind]) for kind in shared}


def _solo_durations(kinds: list[str], every_core: bool) -> dict[str, float]:
    env = {**_env(), "CUDA_VISIBLE_DEVICES": "0"}
    if every_core:
        for key in _threads():
            env.pop(key)
    code = ("import sys, time; sys.path.insert(0, '.'); from scripts.bench_gpu import _run_trial;"
            "k = sys.argv[1]; _run_trial(k); s, e = _run_trial(k); print(e - s)")
    return {kind: float(subprocess.run([sys.executable, "-c", code, kind], env=env, check=True,
                                       capture_output=True, text=True).stdout.split()[-1])
            for kind in sorted(set(kinds))}


def _makespan(db: Path) -> float:
    with sqlite3.connect(db) as con:
        lo, hi = con.execute("SELECT MIN(datetime_start), MAX(datetime_complete) FROM trials "
                             "WHERE state = 'COMPLETE'").fetchone()
    return (datetime.fromisoformat(hi) - datetime.fromisoformat(lo)).total_seconds()


def hpo(work: Path, mode: str, kinds: list[str]) -> tuple[float, float, float]:
    import optuna

    db = work / f"hpo-{mode}.db"
    url = f"sqlite:///{db}"
    study = optuna.create_study(study_name="bench", storage=url, pruner=optuna.pruners.NopPruner())
    for kind in kinds:
        study.enqueue_trial({"kind": kind})
    start = time.time()
    subprocess.run([sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
                    f"objective.target={TARGET}", f"scheduler.parallel={PAR}",
                    f"scheduler.worker_mode={mode}", f"study.n_trials={len(kinds)}", "study.name=bench",
                    "pruner=none", "telemetry.enabled=false", f"storage.url={url}"],
                   check=True, stdout=subprocess.DEVNULL,
                   cwd=work)
    return _makespan(db), start, time.time()


def optuna_threads(work: Path, kinds: list[str]) -> tuple[float, float, float]:
    import optuna

    from tests.objectives import gpu_mix

    os.environ.update(_env())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="bench", storage=_sqlite(work / "optuna-threads.db"),
                                pruner=optuna.pruners.NopPruner())  # the same work as the others
    for kind in kinds:
        study.enqueue_trial({"kind": kind})
    start = time.time()
    study.optimize(gpu_mix, n_trials=len(kinds), n_jobs=PAR)
    done = [t for t in study.trials if t.datetime_start and t.datetime_complete]
    span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    return span, start, time.time()


_task_counter = 0


def _round_robin_task(args: tuple[str, int, int]) -> tuple[float, float]:
    """The incident's pattern: the GPU is chosen inside the worker, after its CUDA may have
    started with an earlier task, so the assignment only holds for the first task."""
    kind, index, gpus = args
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index % max(gpus, 1))
    return _run_trial(kind)


def _watch_for_hang(folder: str | None) -> None:
    """Pool worker initializer: with --hang-dump DIR, each worker writes its stacks there
    if it is still running after 150 s (to see where a stuck worker waits)."""
    if folder:
        import faulthandler

        handle = open(os.path.join(folder, f"pool-worker-{os.getpid()}.txt"), "w")
        faulthandler.dump_traceback_later(150, repeat=False, file=handle)


def process_pool(kinds: list[str], gpus: int, hang_dump: str | None = None) -> tuple[float, float, float]:
    os.environ.update(_env())
    start = time.time()
    # spawn: this process may have started CUDA already (a forked child could not use it)
    with ProcessPoolExecutor(PAR, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_watch_for_hang, initargs=(hang_dump,)) as pool:
        spans = list(pool.map(_round_robin_task, [(k, i, gpus) for i, k in enumerate(kinds)]))
    return max(e for _, e in spans) - min(s for s, _ in spans), start, time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", default="reuse,fresh,threads,pool",
                        help="contenders to run (comma-separated)")
    parser.add_argument("--hang-dump", help="folder for pool workers' stacks if they hang")
    args = parser.parse_args()
    kinds = workload(args.trials)
    sampler = GpuBusy()
    sampler.start()
    gpus = len(sampler.handles)
    solo = solo_durations(kinds)
    work_s = sum(solo[k] for k in kinds)
    bound = max(solo.values())
    serial = work_s / max(gpus, 1)
    said = (f"Every contender: the same {len(kinds)} enqueued trials, fixed params, no pruner, a "
            f"sqlite file (WAL, synchronous=NORMAL), {_threads()['OMP_NUM_THREADS']} threads per "
            f"trial (cores / PAR={PAR}), no telemetry. Lower bound = longest solo trial "
            f"{bound:.1f} s; serial per GPU (total solo work {work_s:.1f} s / {gpus} GPU(s), not "
            f"a bound) {serial:.1f} s.")
    print(f"solo seconds per trial: {solo}\n{said}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        contenders = [
            ("reuse", "hpo-orchestrator, reuse mode", lambda: hpo(Path(tmp), "reuse", kinds)),
            ("fresh", "hpo-orchestrator, fresh mode", lambda: hpo(Path(tmp), "fresh", kinds)),
            ("threads", f"Optuna n_jobs={PAR} (threads, one process)",
             lambda: optuna_threads(Path(tmp), kinds)),
            ("pool", f"process pool of {PAR}, GPUs round-robin inside the worker (no storage)",
             lambda: process_pool(kinds, gpus, args.hang_dump)),
        ]
        for key, name, run in contenders:
            if key not in args.only.split(","):
                continue
            makespan, lo, hi = run()
            busy = sampler.busy(lo, hi)
            rows.append((name, makespan, busy))
            print(f"{name}: makespan {makespan:.1f} s ({makespan / bound:.2f}x the lower bound, "
                  f"{makespan / serial:.2f}x serial per GPU), busy "
                  + ", ".join(f"gpu{i} {b:.0%}" for i, b in enumerate(busy)), flush=True)
    sampler.halt.set()
    name = sampler.nvml.nvmlDeviceGetName(sampler.handles[0]) if gpus else "no GPU (dry run)"
    lines = [f"Command: `python scripts/bench_gpu.py --trials {args.trials}`; {gpus} x {name}, "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
             f"{datetime.now():%Y-%m-%d}. Solo seconds per trial: "
             + ", ".join(f"{k} {v:.2f}" for k, v in solo.items()) + ". " + said, "",
             "| contender | makespan s | vs lower bound | vs serial per GPU | " + " | ".join(
                 f"gpu{i} busy" for i in range(gpus)) + " |",
             "|---|---:|---:|---:|" + "---:|" * gpus]
    for label, makespan, busy in rows:
        lines.append(f"| {label} | {makespan:.1f} | {makespan / bound:.2f}x | {makespan / serial:.2f}x | "
                     + " | ".join(f"{b:.0%}" for b in busy) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
