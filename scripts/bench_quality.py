#!/usr/bin/env python3
"""Time to quality (issue 26): how soon each contender's search finds a good model.

Each contender is launched as its own command from a common wall clock and stopped at the
budget; its curve is read from its own sqlite file (every COMPLETE trial's datetime_complete
and value, less the launch time: imports, data and CUDA/OpenCL set-up count). Targets come
from a longer reference run of the baselines (``--reference`` writes OUT/targets.json: the
median over at least 3 seeds, which no comparison may repeat); the tables give each
contender's time to each target, censored at the budget, and our median speedup against each
baseline over paired seeds with a distribution-free interval and exact sign and signed-rank
p-values (docs/QUALITY.md: method, commands and results).

    python scripts/bench_quality.py --out OUT --workload a --reference --seeds 101-103 \
        --budget 240 --contenders optuna-cpu-t1-median-tuned,optuna-cpu-t1-hyperband-tuned,optuna-cpu-t1-none
    python scripts/bench_quality.py --out OUT --workload a --seeds 1-5 --budget 120 \
        --pair ours,best                          # appends seeds; rerun with --seeds 6-10
    python scripts/bench_quality.py --out OUT --workload b --pair ours,best --seeds 1-5 \
        --common-start 10                         # the same 10 start-up points on both sides
    python scripts/bench_quality.py --out OUT --report-only
    python scripts/bench_quality.py --goals docs/quality-data   # docs/QUALITY.md's goals table

Contenders: ours (defaults), ours-fresh, ours-reuse, ours-tpg1, ours-tpgauto, ours-median,
ours-nopruner, ours-hyperband, ours-cpu, ours-gpu, ours-cpuslots, ours-mvtpe / ours-indtpe
(TPE multivariate and constant liar on / off), ours-startup5, ours-startup20 (TPE
n_startup_trials), ours-tuneauto (pruner.tune=auto), ours-hb (pruner=hyperband), ours-hb3
(the same with min_resource 3), ours-ranked (pruner=ranked_halving), ours-delay /
ours-delay-p1 / ours-delay-p2 (pruner.patience_mode=delay, patience 3 / 1 / 2: the candidates
for the default pruner), ours-tpgauto-hb /
ours-tpgauto-hb3 / ours-tpgauto-ranked (scheduler.parallel=auto scheduler.trials_per_gpu=auto),
ours-tpg1-np ... ours-tpg4-np (K trials per GPU, pruner=none: each level's throughput);
Optuna's processes, one per GPU (or per core without GPUs), pinned by hand: optuna-median,
optuna-hyperband (Optuna's default pruners), optuna-median-tuned, optuna-hyperband-tuned
(set as an expert would: benchmarking/optuna_worker.py), optuna-nopruner, each also as
-xK (K processes on each GPU); on the CPU,
optuna-cpu-tT (cores/T processes of T threads, MedianPruner at Optuna's defaults) and
optuna-cpu-tT-PRUNER (PRUNER: median, median-tuned, hyperband, hyperband-tuned, none);
optuna-threads (one process, n_jobs = GPUs or cores: Optuna's FAQ); ray-asha (Ray Tune: ASHA
over TPE, LightGBM workloads on the CPU, where ray is installed: pip install "ray[tune]");
best: the baseline whose reference runs set the targets.
"""

from __future__ import annotations

try:
    # First: a LightGBM built from source (the CUDA learner of workload b) crashes in its first
    # Dataset if numpy or scikit-learn were loaded before it (docs/GPU.md). The test metric's
    # retraining runs in a spawned child, which re-imports this script before it trains.
    import lightgbm  # noqa: F401
except (ImportError, OSError):  # the CNN workload needs no LightGBM (nor a loadable one)
    pass

import argparse
import functools
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the GPU host runs from the source tree

from scripts.benchmarking import goals, tables  # noqa: E402
from scripts.benchmarking.optuna_worker import GPU_BASELINES, cpu_baseline  # noqa: E402
from scripts.benchmarking.records import trial_records  # noqa: E402
from scripts.benchmarking.workloads import (  # noqa: E402
    WORKLOADS,
    Workload,
    start_points,
    test_metric,
)

OURS = {"ours": [], "ours-fresh": ["scheduler.worker_mode=fresh"],
        "ours-reuse": ["scheduler.worker_mode=reuse"], "ours-tpg1": ["scheduler.trials_per_gpu=1"],
        "ours-tpgauto": ["scheduler.trials_per_gpu=auto"], "ours-median": ["pruner=median"],
        "ours-nopruner": ["pruner=none"], "ours-hyperband": ["pruner=patient_hyperband"],
        "ours-cpu": [], "ours-gpu": [], "ours-cpuslots": ["scheduler.cpu_slots=auto"],
        "ours-mvtpe": ["sampler.multivariate=true", "sampler.constant_liar=true"],
        "ours-indtpe": ["sampler.multivariate=false", "sampler.constant_liar=false"],
        "ours-startup5": ["sampler.n_startup_trials=5"],
        "ours-startup20": ["sampler.n_startup_trials=20"],
        "ours-tuneauto": ["pruner.tune=auto"], "ours-hb": ["pruner=hyperband"],
        "ours-tpgauto-hb": ["scheduler.trials_per_gpu=auto", "pruner=hyperband"],
        "ours-ranked": ["pruner=ranked_halving"],
        "ours-hb3": ["pruner=hyperband", "pruner.min_resource=3"],
        "ours-tpgauto-ranked": ["scheduler.trials_per_gpu=auto", "pruner=ranked_halving"],
        "ours-tpgauto-hb3": ["scheduler.trials_per_gpu=auto", "pruner=hyperband", "pruner.min_resource=3"],
        # the oracle's recipe run by ours: 3 per GPU from launch, its Hyperband from step 3
        "ours-tpg3-hb3": ["scheduler.trials_per_gpu=3", "pruner=hyperband", "pruner.min_resource=3"],
        # candidates for the default pruner: patience delays Hyperband's verdict (DESIGN.md §3.13)
        "ours-delay": ["pruner.patience_mode=delay"],
        "ours-delay-p1": ["pruner.patience_mode=delay", "pruner.patience=1"],
        "ours-delay-p2": ["pruner.patience_mode=delay", "pruner.patience=2"],
        "ours-reach": ["pruner.patience_mode=reach"],  # the default since the runs of cpu-r59
        "ours-veto": ["pruner.patience_mode=veto"],  # the default before them
        # the first trial's start-up alone on its GPU (issue 51.1): against ours, what the
        # start-up overlap (placement/_rules.py) gains or costs
        "ours-overlap": ["scheduler.startup_overlap=true"],
        # the first level rounded up (placement/_rules.py, _level_for): against ours, what going
        # where the climb would end, without timing the level below, gains or costs
        "ours-fill": ["scheduler.first_level=fill"],
        "ours-fill-overlap": ["scheduler.first_level=fill", "scheduler.startup_overlap=true"],
        # workload (c) only (a custom objective's hook): the images and the CUDA context made
        # in objective.setup, as docs/OBJECTIVES.md advises, so workers started ahead pay them
        "ours-setup": ["objective.setup=scripts.benchmarking.cnn:setup"],
        "ours-setup-overlap": ["objective.setup=scripts.benchmarking.cnn:setup",
                               "scheduler.startup_overlap=true"],
        # per-level throughput (issue 51): K trials on each GPU, every trial run to its end,
        # beside ours-nopruner (the packer's levels, its ramp in the run's log)
        **{f"ours-tpg{k}-np": [f"scheduler.trials_per_gpu={k}", "pruner=none"] for k in (1, 2, 3, 4)}}
# ours-cpu / ours-gpu: objective.device through Workload.overrides
# contenders that run on some workloads only (the others refused before any run)
ONLY_ON = {"ours-setup": "c", "ours-setup-overlap": "c"}
# The package as it was before an issue, run as `ours` (every default of then): the "no slower
# than before" goals (issue 51: (a) on the CPU). Its tree comes from git into .bench-trees/REV
# (`--make-trees`, where the history is) and is carried to an offline host; it goes first on
# the run's PYTHONPATH, so the benchmark's own scripts stay today's.
BEFORE = {"ours-before51": "8ff90f4"}
TREES = Path(os.environ.get("HPO_BENCH_TREES") or ROOT / ".bench-trees")
RAY = "ray-asha"  # Ray Tune, ASHA over TPE, LightGBM on the CPU (scripts/benchmarking/ray_worker.py)


@dataclass(frozen=True)
class Half:
    """The GPUs and cores a contender may use (all of them, or half in --pair mode)."""

    gpus: list[int]
    cores: list[int]
    label: str


def packed(name: str) -> tuple[str, int]:
    """``optuna-<pruner>-x<K>``: Optuna's processes packed by hand, K on each GPU (the
    best fixed number per GPU is an oracle no user has up front); (the base name, K)."""
    base, _, k = name.rpartition("-x")
    if base in GPU_BASELINES and k.isdigit() and int(k) >= 1:
        return base, int(k)
    return name, 1


def known(name: str) -> bool:
    return is_ours(name) or packed(name)[0] in GPU_BASELINES \
        or name in ("optuna-threads", RAY) or cpu_baseline(name) is not None


def is_ours(name: str) -> bool:
    """Runs the product (today's, or as it was before an issue: BEFORE)."""
    return name in OURS or name in BEFORE


def tree_of(name: str) -> Path | None:
    """The source tree a BEFORE contender imports; None for today's package."""
    return TREES / BEFORE[name] if name in BEFORE else None


@dataclass(frozen=True)
class Launch:
    """One process of a contender: its command, the GPUs it sees, the cores it is pinned to."""

    argv: list[str]
    gpus: list[int]
    cores: list[int]
    threads: int | None = None  # OMP/MKL/OPENBLAS threads (ours sets its trials' own)
    tree: Path | None = None  # the package's source tree, where not today's (BEFORE)


def make_trees(revisions: list[str]) -> int:
    """The package and its configuration as at each revision, in .bench-trees/REV (git
    archive; hpo_orchestrator/conf, a link to conf/ in the repository, made a copy)."""
    for rev in revisions:
        folder = TREES / rev
        if (folder / "hpo_orchestrator").is_dir():  # made by an earlier call
            continue
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "hpo_orchestrator", "conf"],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            folder.rmdir()
            print(f"error: git archive {rev}: {archive.stderr.decode().strip()}\nhint: run it in "
                  "a clone with the history (not on the GPU host's copy)", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        link = folder / "hpo_orchestrator" / "conf"
        if link.is_symlink():  # a copy: a carried tree may lose its links on the way
            link.unlink()
            shutil.copytree(folder / "conf", link)
        print(f"{folder}: the package as at {rev}")
    return 0


def launches(name: str, work: Workload, scale: float, seed: int, budget: float, half: Half,
             url: str, run_dir: Path, gpu_learner: str = "gpu") -> list[Launch]:
    """The processes that make up one contender's run. Ours gets the whole half (it pins its
    own trials); Optuna's processes get a GPU each (none on the CPU) and a slice of the cores."""
    py = sys.executable
    if is_ours(name):
        # scheduler.parallel's default: every GPU of the half once, or one trial per core
        parallel = ["scheduler.parallel=auto"] if name.startswith("ours-tpgauto") else []
        device = {"ours-cpu": "cpu", "ours-gpu": "gpu"}.get(name, "auto")
        return [Launch([py, "-m", "hpo_orchestrator", "run", *work.overrides(device),
                        *parallel, "study.name=bench", f"storage.url={url}",
                        "study.n_trials=1000000", f"study.timeout_s={budget}",
                        f"sampler.seed={seed}", f"scheduler.lease_dir={run_dir / 'leases'}",
                        *OURS.get(name, [])], half.gpus, half.cores,
                       tree=tree_of(name))]
    base = [py, "-m", "scripts.benchmarking.optuna_worker", "--workload", work.name,
            "--scale", str(scale), "--storage", url, "--seed", str(seed), "--timeout", str(budget)]
    if name == RAY:  # one driver; Ray runs a trial of 1 thread per core it is given
        return [Launch([py, "-m", "scripts.benchmarking.ray_worker", "--workload",
                        work.name, "--scale", str(scale), "--storage", url, "--seed", str(seed),
                        "--timeout", str(budget), "--cpus", str(len(half.cores)), "--threads",
                        "1", "--run-dir", str(run_dir)], [], half.cores, 1)]
    if name == "optuna-threads":  # Optuna's FAQ: n_jobs threads in one process, nothing pinned
        jobs = len(half.gpus) or len(half.cores)
        threads = max(1, len(half.cores) // jobs)
        return [Launch([*base, "--n-jobs", str(jobs), "--threads", str(threads), "--device",
                        gpu_learner if half.gpus else "cpu"], half.gpus, half.cores, threads)]
    cpu = cpu_baseline(name)
    on_cpu = cpu is not None
    base_name, per_gpu = packed(name)
    places = len(half.gpus) * per_gpu or len(half.cores)
    threads = cpu[0] if cpu else max(1, len(half.cores) // places)
    count = max(1, len(half.cores) // threads) if cpu else places
    pruner = cpu[1] if cpu else GPU_BASELINES[base_name]
    out = []
    for i in range(count):
        cores = half.cores[i * threads:(i + 1) * threads] or half.cores
        gpus = [] if on_cpu or not half.gpus else [half.gpus[i % len(half.gpus)]]
        out.append(Launch([*base, "--index", str(i), "--pruner", pruner, "--threads", str(threads),
                           "--device", gpu_learner if gpus else "cpu"], gpus, cores, threads))
    return out


class GpuWatch(threading.Thread):
    """Every GPU's utilization every 0.5 s through the product's backend (NVML; none here)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        from hpo_orchestrator.gpu import open_backend

        self.backend = open_backend()
        self.gpus = [g.index for g in self.backend.gpus()]
        self.samples: list[tuple[float, dict[int, float]]] = []

    def run(self) -> None:
        while True:
            time.sleep(0.5)
            row = {}
            for index in self.gpus:
                sample = self.backend.sample(index)
                row[index] = float(sample.sm_util) if sample and sample.sm_util is not None else 0.0
            self.samples.append((time.time(), row))

    def mean(self, gpus: list[int], lo: float, hi: float) -> dict[str, float]:
        rows = [r for t, r in self.samples if lo <= t <= hi]
        return {f"gpu{g}": round(sum(r.get(g, 0.0) for r in rows) / len(rows), 1) if rows else 0.0
                for g in gpus}

    def trace(self, gpus: list[int], lo: float, hi: float) -> list[list[float]]:
        """The readings between ``lo`` and ``hi``: [seconds after lo, one GPU's % after another]."""
        return [[round(t - lo, 1), *(r.get(g, 0.0) for g in gpus)]
                for t, r in self.samples if lo <= t <= hi]


def start(name: str, work: Workload, args: argparse.Namespace, seed: int, half: Half,
          group: str) -> dict[str, Any]:
    from hpo_orchestrator.gpu import nvidia_icd_env

    folder = group.replace(":", "-").replace("+", "-")  # plain names: the GPU tool skips odd ones
    run_dir = (args.runs or args.out / "runs") / work.name / folder / f"{name}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob("bench.db*"):
        stale.unlink()
    url = f"sqlite:///{run_dir / 'bench.db'}"
    if args.common_start:  # before the launch: the contender's clock has not started
        _enqueue_start(url, start_points(work, seed, args.common_start))
    commands = launches(name, work, args.scale, seed, args.budget, half, url, run_dir,
                        args.gpu_learner)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "HPO_QUALITY_SCALE": str(args.scale), "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
           **nvidia_icd_env()}
    launch = time.time()
    procs = []
    for i, one in enumerate(commands):
        # taskset where installed; else the same affinity set in the child before exec
        pin = ["taskset", "-c", ",".join(map(str, one.cores))] if shutil.which("taskset") else []
        with (run_dir / f"process-{i}.log").open("w") as log:
            procs.append(subprocess.Popen(
                [*pin, *one.argv], cwd=run_dir, env=process_env(one, env), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=None if pin else functools.partial(os.sched_setaffinity, 0, one.cores)))
    return {"contender": name, "seed": seed, "workload": work.name, "group": group, "dir": str(run_dir),
            "half": half.label, "gpus": half.gpus, "cores": half.cores, "launch": launch,
            "budget_s": args.budget, "url": url, "gpu_learner": args.gpu_learner, "procs": procs,
            "load_1m": os.getloadavg()[0],
            "commands": [" ".join(one.argv[1:]) for one in commands]}


def process_env(one: Launch, env: dict[str, str]) -> dict[str, str]:
    """``env`` for one process of a contender: the GPUs it sees, its threads where set, and
    the package's earlier tree ahead of today's where it runs one (BEFORE)."""
    extra = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, one.gpus))}
    if one.tree is not None:
        extra["PYTHONPATH"] = f"{one.tree}:{env.get('PYTHONPATH', '')}"
    if one.threads:
        extra.update(dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"),
                                   str(one.threads)))
    return {**env, **extra}


def _enqueue_start(url: str, points: list[dict[str, Any]]) -> None:
    """The run's study, created with ``points`` queued: every contender (ours through its
    own run, Optuna's processes through load_if_exists) tries them first, in this order."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="bench", storage=url, direction="minimize")
    for point in points:
        study.enqueue_trial(point)


def stop(run: dict[str, Any]) -> None:
    """At the budget: SIGTERM to every process group, SIGKILL 15 s later. A process that had
    already ended with an error is recorded (a baseline short of a process is not fair)."""
    run["early_failures"] = [p.returncode for p in run["procs"] if p.poll() not in (None, 0)]
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        for proc in run["procs"]:
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
        deadline = time.time() + wait
        while time.time() < deadline and any(p.poll() is None for p in run["procs"]):
            time.sleep(0.2)
    run["exit_codes"] = [p.returncode for p in run.pop("procs")]


def collect(run: dict[str, Any], watch: GpuWatch, with_test: bool, threads: int) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    launch, budget = run["launch"], run["budget_s"]
    try:
        trials = optuna.load_study(study_name="bench", storage=run.pop("url")).trials
    except KeyError:  # the contender never created its study
        trials = []
    state = optuna.trial.TrialState
    ended = [t for t in trials if t.datetime_complete and t.datetime_complete.timestamp() - launch <= budget]
    done = [t for t in ended if t.state == state.COMPLETE and t.value is not None]
    run["curve"] = sorted((round(t.datetime_complete.timestamp() - launch, 3), t.value) for t in done)
    run["complete"] = len(done)
    run["pruned"] = sum(t.state == state.PRUNED for t in ended)
    run["failed"] = sum(t.state == state.FAIL for t in ended)
    run["gpu_util"] = watch.mean(run["gpus"], launch, launch + budget)
    run["gpu_util_mean"] = round(sum(run["gpu_util"].values()) / len(run["gpu_util"]), 1) \
        if run["gpu_util"] else 0.0
    # issue 51's goal reads GPU busy after a run's first 20 s; the trace keeps any other window
    after = watch.mean(run["gpus"], launch + 20, launch + budget)
    run["gpu_util_after_20s"] = round(sum(after.values()) / len(after), 1) if after else 0.0
    run["gpu_trace"] = watch.trace(run["gpus"], launch, launch + budget)
    best = min(done, key=lambda t: t.value) if done else None
    run["best_value"] = best.value if best else None
    run["best_params"] = best.params if best else None
    try:
        run["trials"] = trial_records(trials, launch, budget)
    except Exception as exc:  # a diagnostic never costs the batch its results
        run["trials"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    run["test"] = None
    if best and with_test:
        device, gpu = retrain_device(run, best.user_attrs)
        try:
            run["test"] = held_out_test(run["workload"], best.params, threads, best.number,
                                        device, gpu)
        except Exception as exc:  # the batch's other runs and this one's curve are kept
            run["test"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return run


def retrain_device(run: dict[str, Any], attrs: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """LightGBM's device for retraining the best trial, and the GPU to show the retraining:
    its CUDA learner where the trial used it, on the run's first GPU (the CUDA and CPU
    learners grow different trees: a CPU retraining of a CUDA trial missed its validation loss
    by up to 0.023 on workload b), else the CPU, where retraining reproduces a CPU trial
    exactly. OpenCL trials are retrained on the CPU too, which reproduces them only roughly
    (OpenCL sums in single precision)."""
    if run["contender"] in OURS:
        learner = (attrs.get("hpo.params_effective") or {}).get("device_type", "cpu")
    else:  # the --device its processes were launched with (launches)
        words = run["commands"][0].split()
        learner = words[words.index("--device") + 1] if "--device" in words else "cpu"
    if learner == "cuda" and run["gpus"]:
        return {"device_type": "cuda", "gpu_device_id": 0}, run["gpus"][0]
    return {"device_type": "cpu"}, None


def _show_only(gpu: int | None) -> None:
    """In the retraining child, before CUDA starts: the run's GPU by NVML index, as the
    contenders' processes see theirs (PCI bus order)."""
    if gpu is not None:
        os.environ.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu))


def held_out_test(workload: str, params: dict[str, Any], threads: int, trial_number: int,
                  device: dict[str, Any], gpu: int | None = None) -> dict[str, Any]:
    """The test metric, retrained in a child process: in this process the CNN's CUDA context and
    cached images would stay on GPU 0, whose memory the next run's orchestrator then reads as
    another user's work and skips (its busy-GPU rule): a benchmark that slows ours down."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_show_only, initargs=(gpu,)) as pool:
        return pool.submit(test_metric, WORKLOADS[workload], params, threads,
                           trial_number, device).result()


def slim(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "hpo-runs", ignore_errors=True)
    shutil.rmtree(run_dir / "leases", ignore_errors=True)
    shutil.rmtree(run_dir / "ray", ignore_errors=True)  # Tune's own results (ray-asha)
    for path in run_dir.glob("bench.db*"):
        path.unlink()


def seed_batches(names: list[str], pair: str | None, seed: int) -> list[list[tuple[str, str]]]:
    """What runs together for one seed: the pair on the two halves (swapped on odd seeds), or
    each contender alone on the whole machine (or block), one after the other, the order
    rotated by the seed: the first run on a fresh host took 4 s longer over the same first
    trial, most likely a cold page cache (docs/GPU.md, eighth session), so no contender is
    always first."""
    if pair:
        first, second = ("first", "second") if seed % 2 == 0 else ("second", "first")
        return [[(names[0], first), (names[1], second)]]
    turn = seed % len(names)
    return [[(name, "all")] for name in names[turn:] + names[:turn]]


def half(which: str, gpus: list[int], cores: list[int]) -> Half:
    """The GPUs and cores of ``which`` ("all", "first", "second") of a block."""
    if which == "all":
        return Half(gpus, cores, "all")
    g, c = len(gpus) // 2, len(cores) // 2
    if which == "first":
        return Half(gpus[:g], cores[:c], f"first half, cores {cores[0]}-{cores[c - 1]}")
    return Half(gpus[g:], cores[c:], f"second half, cores {cores[c]}-{cores[-1]}")


def reference_refusal(entry: dict[str, Any], seeds: list[int]) -> str:
    """Why the targets ``entry`` (targets.json) cannot judge a comparison of ``seeds`` ("" where
    they can): taken from fewer than 3 reference seeds (one seed's luck sets the bar), or from
    seeds the comparison repeats (the baseline would rerun the very search that set its
    targets). Both are named where both hold (the overlap is checked at any count)."""
    used = entry.get("seed_list")
    why = []
    if used is None or len(used) < goals.MIN_REFERENCE_SEEDS:
        why.append(f"the targets come from {entry.get('seeds', 0) if used is None else len(used)} "
                   f"reference seed(s) of {entry['contender']}")
    repeated = sorted(set(used or []) & set(seeds))
    if repeated:
        why.append(f"seeds {repeated} are the reference's own (it ran {used})")
    return "; ".join(why)


def setup_refusal(entry: dict[str, Any], gpus: int, cores: int) -> str:
    """Why the targets ``entry`` cannot judge runs of ``gpus`` GPUs and ``cores`` cores each
    ("" where they can): its reference ran on another set-up, so its targets say what that
    set-up reaches in the budget (a reference on 8 cores a run set a target that none of 16
    runs on 2 reached: docs/quality/runs.md, torch_mlp). Targets written before the set-up
    was recorded (targets.json without ``setup``) are not checked."""
    setup = entry.get("setup")
    if setup is None or setup == [{"gpus": gpus, "cores": cores}]:
        return ""
    ran = ", ".join(f"{s['gpus']} GPU(s) and {s['cores']} cores" for s in setup)
    return (f"the targets come from reference runs of {ran} each; this comparison gives each "
            f"contender {gpus} GPU(s) and {cores} cores")


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def targets_from(store: tables.Store, folder: Path, workload: str, contender: str,
                 seeds: list[int], group: str | None = None) -> int:
    """Targets for ``workload`` from the runs of ``contender`` and ``seeds`` (of ``group``, if
    given) kept in ``folder`` (a comparison's or a reference's), written to ``store``'s
    targets.json with a note saying where they came from: a reference that costs no machine
    time where such runs exist."""
    runs = [r for r in tables.Store(folder).runs if r["workload"] == workload
            and r["contender"] == contender and r["seed"] in seeds
            and (group is None or r["group"] == group)]
    budgets = {r["budget_s"] for r in runs}
    if len(runs) < goals.MIN_REFERENCE_SEEDS or len(runs) != len({r["seed"] for r in runs}) \
            or len(budgets) != 1:
        groups = sorted({r["group"] for r in runs})
        print(f"error: {folder} holds {len(runs)} run(s) of {contender} on workload {workload} "
              f"with seeds {sorted({r['seed'] for r in runs})}, budgets {sorted(budgets)}, "
              f"in group(s) {', '.join(groups) or 'none'}\n"
              f"hint: name one contender and at least {goals.MIN_REFERENCE_SEEDS} seeds it ran "
              "once each, at one budget (--targets-group GROUP keeps one group's runs)",
              file=sys.stderr)
        return 2
    entry = tables.targets_of(runs)
    groups = ", ".join(sorted({r["group"] for r in runs}))
    entry["note"] = (f"from {folder}'s runs of {contender}, seeds {entry['seed_list']}, group "
                     f"{groups} ({entry['budget_s']:g}-s runs): the best value at 10, 50 and 100 % "
                     "of the budget, median over the seeds")
    print(json.dumps(store.write_targets(workload, entry), indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the results folder (every mode but --goals)")
    parser.add_argument("--goals", type=Path, metavar="ROOT", help="print docs/QUALITY.md's goals "
                        "table, judged from the kept results under ROOT (docs/quality-data)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="a")
    parser.add_argument("--contenders", default="ours,optuna-cpu-t1")
    parser.add_argument("--pair", help="A,B: two contenders at once on disjoint halves of the GPUs "
                        "and cores, the halves swapped between seeds")
    parser.add_argument("--seeds", default="1-2", help="e.g. 1-5 or 6,7 (appended to OUT)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--reference", action="store_true", help="a reference run: writes targets.json")
    parser.add_argument("--scale", type=float, default=1.0, help="data size factor (dry runs)")
    parser.add_argument("--no-test", action="store_true", help="skip the held-out test metric")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--slim", action="store_true", help="after each run keep only its process "
                        "logs (drop its sqlite file and trial logs: results.json has the curve)")
    parser.add_argument("--runs", type=Path, help="where the runs' folders go (default OUT/runs)")
    parser.add_argument("--cpus", help="cores to use, e.g. 0-31 (default: this process's affinity)")
    parser.add_argument("--no-gpu", action="store_true", help="give the contenders no GPU (a CPU "
                        "workload on a GPU host: CUDA_VISIBLE_DEVICES empty)")
    parser.add_argument("--gpu-learner", choices=("gpu", "cuda"), default="gpu",
                        help="LightGBM learner of Optuna's GPU processes: gpu (OpenCL, PyPI's "
                        "wheel) or cuda (a LightGBM built with CUDA; ours prefers it by itself)")
    parser.add_argument("--common-start", type=int, default=0, metavar="K",
                        help="queue the same K random points of the search space (drawn from "
                        "the seed) first in every contender's study: common random numbers for "
                        "the start-up trials (TPE's first 10 are random); its own table group")
    parser.add_argument("--make-trees", action="store_true", help="extract the source trees of "
                        "the contenders that run the package as it was (ours-before51) into "
                        ".bench-trees/ from git, and exit")
    parser.add_argument("--targets-from", type=Path, metavar="FOLDER", help="write OUT's targets "
                        "for --workload from FOLDER's kept runs of --contenders (one) and --seeds "
                        "instead of a --reference call (runs already made on the comparison's "
                        "set-up), and exit")
    parser.add_argument("--targets-group", metavar="GROUP", help="with --targets-from: only the "
                        "runs of this table group (where the contender ran the seeds in several)")
    parser.add_argument("--concurrent", type=int, default=1, help="K: run K seeds (or reference "
                        "runs) at once, each on its own block of cores/K (needs --no-gpu or K=1)")
    args = parser.parse_args()
    if args.goals:
        print(goals.goals_table(args.goals), end="")
        return 0
    if args.out is None:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    store = tables.Store(args.out)
    if args.report_only:
        store.write_report()
        return 0
    if args.targets_from:
        if args.pair or args.reference or "," in args.contenders:
            print("error: --targets-from takes the targets of one baseline from kept runs; "
                  "it runs nothing\nhint: name that baseline with --contenders, without --pair or "
                  "--reference", file=sys.stderr)
            return 2
        return targets_from(store, args.targets_from, args.workload, args.contenders,
                            parse_seeds(args.seeds), args.targets_group)
    names = args.pair.split(",") if args.pair else args.contenders.split(",")
    best = store.targets().get(args.workload, {}).get("contender")
    names = [best if n == "best" and best else n for n in names]  # the reference's best baseline
    if [n for n in names if not known(n)] or (args.pair and len(names) != 2):
        print(f"error: unknown contenders or not a pair: {names}\nhint: see --help", file=sys.stderr)
        return 2
    elsewhere = [n for n in names if ONLY_ON.get(n, args.workload) != args.workload]
    if elsewhere:
        print(f"error: {', '.join(elsewhere)} run(s) on workload "
              f"{', '.join(sorted({ONLY_ON[n] for n in elsewhere}))} only, not {args.workload}\n"
              "hint: see the contenders in docs/quality/method.md", file=sys.stderr)
        return 2
    others = [n for n in names if not is_ours(n)]
    if WORKLOADS[args.workload].kind == "torch_mlp" and others:
        print(f"error: workload {args.workload} (the built-in torch_mlp) runs ours' contenders "
              f"only, not {', '.join(others)}\nhint: e.g. --pair ours,ours-before51", file=sys.stderr)
        return 2
    if args.make_trees:
        return make_trees([BEFORE[n] for n in names if n in BEFORE])
    missing = [BEFORE[n] for n in names
               if (tree := tree_of(n)) is not None and not (tree / "hpo_orchestrator").is_dir()]
    if missing:
        print(f"error: no source tree of {', '.join(missing)} in {TREES}\nhint: run the same "
              "command with --make-trees where the repository's history is, then carry "
              ".bench-trees to this host", file=sys.stderr)
        return 2
    if args.common_start < 0 or (args.common_start and RAY in names):
        print(f"error: --common-start {args.common_start}: K >= 0, and not with {RAY} (its "
              "searcher keeps its own study)\nhint: leave --common-start out", file=sys.stderr)
        return 2
    if RAY in names and (WORKLOADS[args.workload].kind != "lightgbm"
                         or importlib.util.find_spec("ray") is None):
        print(f"error: {RAY} runs the LightGBM workloads (a, b) where Ray Tune is installed\n"
              'hint: pip install "ray[tune]" (about 150 MB; docs/quality/method.md, Contenders)',
              file=sys.stderr)
        return 2
    if not args.reference and not store.targets().get(args.workload):
        print(f"error: no targets for workload {args.workload} in {args.out}/targets.json\n"
              f"hint: run with --reference first", file=sys.stderr)
        return 2
    if not args.reference:
        refused = reference_refusal(store.targets()[args.workload], parse_seeds(args.seeds))
        if refused:
            print(f"error: {refused}\nhint: run --reference with at least "
                  f"{goals.MIN_REFERENCE_SEEDS} seeds that no comparison uses (e.g. --seeds "
                  "101-103), every baseline that could be the best among --contenders",
                  file=sys.stderr)
            return 2
    work = WORKLOADS[args.workload].scaled(args.scale)
    os.environ["HPO_QUALITY_SCALE"] = str(args.scale)  # the CNN's retraining here reads it too
    watch = GpuWatch()
    watch.start()
    cores = parse_seeds(args.cpus) if args.cpus else sorted(os.sched_getaffinity(0))
    gpus = [] if args.no_gpu else watch.gpus
    if args.concurrent < 1 or (args.concurrent > 1 and gpus) or len(cores) < 2 * args.concurrent:
        print(f"error: --concurrent {args.concurrent} with {len(gpus)} GPUs and {len(cores)} cores\n"
              "hint: concurrent runs split the cores, not the GPUs: add --no-gpu (a CPU workload), "
              "and give at least 2 cores per run", file=sys.stderr)
        return 2
    block = len(cores) // args.concurrent
    blocks = [cores[i * block:(i + 1) * block] for i in range(args.concurrent)]
    # each half a contender runs on: an odd count of cores or GPUs splits them unevenly
    entry = {} if args.reference else store.targets()[args.workload]
    for which in ("first", "second") if args.pair else ("all",):
        each = half(which, gpus, blocks[0])
        refused = setup_refusal(entry, len(each.gpus), len(each.cores))
        if refused:
            print(f"error: {refused}\nhint: run --reference on the comparison's set-up (the "
                  "same --cpus and --concurrent share per run, the same GPUs), into a folder "
                  "of its own", file=sys.stderr)
            return 2
    group = "reference" if args.reference else (f"pair:{names[0]}+{names[1]}" if args.pair else "solo")
    if args.common_start and not args.reference:
        group += f":start{args.common_start}"  # other runs than those without: kept apart
    meta = {"command": " ".join(sys.argv), "commit": tables.commit(ROOT),
            "source": tables.source_trees(ROOT), "scale": args.scale,
            "concurrent": args.concurrent,
            "machine": f"{platform.node()}: {len(cores)} cores, "
                       f"{', '.join(g.name for g in watch.backend.gpus()) if gpus else 'no GPU'}, "
                       f"Python {platform.python_version()}"}
    batches = [(seed, batch) for seed in parse_seeds(args.seeds)
               for batch in seed_batches(names, args.pair, seed)]
    for at in range(0, len(batches), args.concurrent):  # K batches at once, one block each
        runs = [start(name, work, args, seed, half(which, gpus, cores_of), group)
                for (seed, batch), cores_of in zip(batches[at:at + args.concurrent], blocks, strict=False)
                for name, which in batch]
        time.sleep(max(0.0, max(r["launch"] for r in runs) + args.budget - time.time()))
        for run in runs:
            stop(run)
        # each run's test retraining is its own process: a batch's runs side by side, sharing
        # this process's cores
        threads = max(1, len(os.sched_getaffinity(0)) // len(runs))
        one = functools.partial(collect, watch=watch, threads=threads,
                                with_test=not args.no_test and not args.reference
                                and work.kind != "torch_mlp")
        with ThreadPoolExecutor(len(runs)) as pool:
            results = list(pool.map(one, runs))
        for result in results:
            store.add({**result, **meta})
            if args.slim:
                slim(Path(result["dir"]))
            print(f"[{time.strftime('%H:%M:%S')}] {args.workload} {group} {result['contender']} "
                  f"seed {result['seed']} ({result['half']}): {result['complete']} complete, "
                  f"{result['pruned']} pruned, best {result['best_value']}, "
                  f"GPU {result['gpu_util']}, exit {result['exit_codes']}", flush=True)
    if args.reference:
        entry = store.update_targets(args.workload)
        print(json.dumps(entry, indent=1))
        if not all(v < float("inf") for v in entry["targets"].values()):
            print("warning: the best baseline had no trial by some fraction of its budget: that "
                  "target is met by any run at once; use a longer --budget", file=sys.stderr)
    store.write_report()
    print(f"results: {args.out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
