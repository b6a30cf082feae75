"""One of Optuna's own processes in the benchmark: Optuna done right, as its docs show it.

    python -m scripts.benchmarking.optuna_worker --workload a --storage URL \
        --seed 3 --index 0 --pruner median --device gpu --threads 8 --timeout 90

Several of these share one sqlite study (WAL, a busy timeout); each is pinned by its
launcher (CUDA_VISIBLE_DEVICES, taskset). TPE with ``multivariate=True, constant_liar=True``,
seeded per process (the same seed in every process would propose the same start-up points).

Pruners (``--pruner``): Optuna's defaults (``median``: MedianPruner(), which on 20-report
curves pruned three trials in four, often the ones that would have ended best;
``hyperband``: HyperbandPruner(), min_resource 1), and what an expert sets for curves of a
known length (:data:`PRUNERS`): ``median-tuned`` waits for 10 finished trials (TPE's random
start-up, so the median is not that of a handful of points) and 30 % of the curve (Optuna's
own MedianPruner example waits 30 of 100 steps; the product's ``pruner=median`` waits 3 of
20), ``hyperband-tuned`` starts its brackets at 3 reports with reduction factor 3, as the
product's default pruner, and ``none``. The benchmark's reference runs all three and takes
the best (docs/QUALITY.md).
``--n-jobs`` > 1 is Optuna's thread mode (its FAQ's answer to "how to run in parallel").
On a GPU, LightGBM trains on NVIDIA's OpenCL platform picked by name, with NVIDIA's ICD
registered by the launcher: the host's default platform may be PoCL, a CPU, which trains at
0 % GPU without a warning. No NVIDIA platform: exit 3, never a silent CPU run.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["EXPERT_PRUNERS", "GPU_BASELINES", "LIGHTGBM_WORKLOADS", "PRUNERS", "cpu_baseline", "main",
           "make_pruner", "pruner_of"]

# The workloads that train LightGBM (workloads.WORKLOADS, kind "lightgbm"; a test checks),
# named here so that LightGBM can be imported before the module that would import numpy
LIGHTGBM_WORKLOADS = ("a", "b")


def _sqlite_pragmas() -> None:
    """WAL, synchronous=NORMAL and a busy timeout on every connection, as the product sets on
    its own (db/connect.py), so neither side pays for the other's storage settings."""
    import sqlalchemy
    from sqlalchemy import event

    @event.listens_for(sqlalchemy.engine.Engine, "connect")
    def _tune(dbapi_connection: Any, _record: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            for pragma in ("journal_mode=WAL", "busy_timeout=30000", "synchronous=NORMAL"):
                dbapi_connection.execute("PRAGMA " + pragma)


PRUNERS = ("median", "median-tuned", "hyperband", "hyperband-tuned", "none")
EXPERT_PRUNERS = frozenset({"median-tuned", "hyperband-tuned", "none"})


# The benchmark's contenders made of these processes: one per GPU (per core without GPUs) ...
GPU_BASELINES = {"optuna-median": "median", "optuna-median-tuned": "median-tuned",
                 "optuna-hyperband": "hyperband", "optuna-hyperband-tuned": "hyperband-tuned",
                 "optuna-nopruner": "none"}


def cpu_baseline(name: str) -> tuple[int, str] | None:
    """... or ``optuna-cpu-tT[-PRUNER]``: cores / T processes of T threads on the CPU, with
    PRUNER (MedianPruner at Optuna's defaults without one, as the runs kept from before the
    expert pruners were named); (T, pruner), or None for another name."""
    if not name.startswith("optuna-cpu-t"):
        return None
    threads, _, pruner = name[len("optuna-cpu-t"):].partition("-")
    if not threads.isdigit() or int(threads) < 1 or (pruner and pruner not in PRUNERS):
        return None
    return int(threads), pruner or "median"


def pruner_of(name: str) -> str | None:
    """The pruner of an Optuna baseline contender (``-xK``: K processes on each GPU); None
    for any other contender."""
    cpu = cpu_baseline(name)
    base, _, k = name.rpartition("-x")
    return cpu[1] if cpu else GPU_BASELINES.get(base if k.isdigit() else name)


def make_pruner(name: str, reports: int) -> Any:
    """The pruner ``name`` for curves of ``reports`` steps (numbered from 1)."""
    import optuna

    pruners = optuna.pruners
    if name == "median":
        return pruners.MedianPruner()
    if name == "median-tuned":
        return pruners.MedianPruner(n_startup_trials=10, n_warmup_steps=max(3, round(0.3 * reports)))
    if name == "hyperband":
        return pruners.HyperbandPruner()
    if name == "hyperband-tuned":
        return pruners.HyperbandPruner(min_resource=3, max_resource=reports, reduction_factor=3)
    if name == "none":
        return pruners.NopPruner()
    raise ValueError(f"unknown pruner {name!r}: one of {', '.join(PRUNERS)}")


def _lightgbm_device(device: str) -> dict[str, Any]:
    from hpo_orchestrator.gpu import choose_lightgbm_device, list_platforms

    if device == "cpu":
        return {"device_type": "cpu"}
    if device == "cuda":  # LightGBM's CUDA learner, pinned by CUDA_VISIBLE_DEVICES like torch
        from hpo_orchestrator.objectives import cuda_learner_available

        available, why = cuda_learner_available()
        if not available:
            print(f"error: this LightGBM has no CUDA learner ({why})", file=sys.stderr)
            raise SystemExit(3)
        print("LightGBM's CUDA learner", file=sys.stderr)
        return {"device_type": "cuda"}
    platforms = list_platforms()
    choice = choose_lightgbm_device(True, "gpu", "auto", platforms)
    if choice.params.get("device_type") != "gpu" or choice.warning:
        print(f"error: no NVIDIA OpenCL platform for LightGBM ({choice.warning}); "
              f"platforms: {platforms}", file=sys.stderr)
        raise SystemExit(3)
    print(f"LightGBM on OpenCL platform {choice.platform}: {choice.params}", file=sys.stderr)
    return dict(choice.params)


def _create_or_load(name: str, storage: str, sampler: Any, pruner: Any) -> Any:
    """The shared study, created by whichever process comes first. Processes that start
    together on a new sqlite file race to create its tables ('table studies already exists'):
    or an IntegrityError on alembic_version): the loser retries, inside the timed launch."""
    import optuna
    import sqlalchemy.exc

    for attempt in range(50):
        try:
            return optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                       pruner=pruner, load_if_exists=True)
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError):
            if attempt == 49:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", default="bench")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--index", type=int, default=0, help="this process's number")
    parser.add_argument("--pruner", choices=PRUNERS, default="median")
    parser.add_argument("--device", choices=("cpu", "gpu", "cuda"), default="cpu",
                        help="gpu: LightGBM's OpenCL learner; cuda: its CUDA learner")
    parser.add_argument("--threads", type=int, default=1, help="threads per trial")
    parser.add_argument("--n-jobs", type=int, default=1, help="Optuna threads in this process")
    parser.add_argument("--timeout", type=float, required=True, help="seconds")
    args = parser.parse_args(argv)
    if args.workload in LIGHTGBM_WORKLOADS:
        # LightGBM's library before numpy: a LightGBM built from source (the CUDA learner)
        # crashed in its first Dataset otherwise, as the product's workers would have
        # (hpo_orchestrator/worker/__main__.py, docs/GPU.md)
        import lightgbm  # noqa: F401

    import optuna

    from scripts.benchmarking.workloads import WORKLOADS, lightgbm_objective

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _sqlite_pragmas()
    workload = WORKLOADS[args.workload].scaled(args.scale)
    objective: Callable[[Any], float]
    if workload.kind == "cnn":
        from scripts.benchmarking import cnn

        objective, reports = cnn.objective, cnn.EPOCHS
    else:
        objective = lightgbm_objective(workload.lightgbm, _lightgbm_device(args.device),
                                       args.threads, threaded=args.n_jobs > 1)
        reports = workload.lightgbm.num_boost_round // workload.lightgbm.report_every
    sampler = optuna.samplers.TPESampler(multivariate=True, constant_liar=True,
                                         seed=args.seed * 1000 + args.index)
    study = _create_or_load(args.study, args.storage, sampler, make_pruner(args.pruner, reports))
    optimize_past_queue_races(study, objective, args.timeout, args.n_jobs)
    return 0


def optimize_past_queue_races(study: Any, objective: Callable[[Any], float], timeout: float,
                              n_jobs: int, clock: Callable[[], float] = time.monotonic) -> int:
    """``study.optimize`` until ``timeout``, going on after a start point that two processes
    took: Optuna's trial queue is not atomic on SQLite (optuna/optuna#4002), so two processes
    can pop the same enqueued trial, and the second to finish it dies with "Cannot tell a
    COMPLETE trial" (seed 24 of docs/quality-data/gpu-o61 lost one of its three processes
    so). A process short is no fair baseline; the duplicate trial's work is lost either way.
    Returns how many such races it went past."""
    end, races = clock() + timeout, 0
    while (left := end - clock()) > 0:
        try:
            study.optimize(objective, timeout=left, n_jobs=n_jobs)
            return races
        except ValueError as error:
            if not str(error).startswith("Cannot tell a "):
                raise
            races += 1
            print(f"went on after a start point another process also took: {error}",
                  file=sys.stderr, flush=True)
    return races


if __name__ == "__main__":
    sys.exit(main())
