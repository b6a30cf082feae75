#!/usr/bin/env python3
"""Benchmarks of the scheduler itself, contenders side by side in one run (CPU slots).

Fair by construction: the orchestrator and Optuna's processes run the same sampler (random),
no pruner, the same storage (a sqlite file, WAL, synchronous=NORMAL), the same thread variables
and no telemetry; each table prints this above it, and a row that differs says so.

1. Overhead: N trials of an objective that sleeps 0.2 s, PAR=4: makespan over the ideal
   (N x 0.2 / 4) for this product in fresh and reuse mode, Optuna's own 4 processes sharing
   one sqlite storage (WAL), and Ray Tune with 4 concurrent trials when ``ray[tune]`` is
   installed (said when skipped).
2. Throughput: trials/s of a trivial objective with 10 reports each at PAR=8 on sqlite, this
   product (both modes) against Optuna's own 8 processes on the same kind of storage, by wall
   time (the command's, start-up included: the goals are stated by it) and by makespan
   (first trial's start to last trial's end: it leaves out the orchestrator's start-up, whose
   first wave imports before the first trial, but not Optuna's processes', which import
   before they ask). The orchestrator's reports reach the database up to storage.refresh_s
   late, in batches (Optuna's processes write each at once): another write pattern.
3. First-decision latency on a study of 20,000 trials: objective start to the first
   ``should_prune`` answer, through the orchestrator, against a fresh Optuna process that
   attaches to the study itself.

In every part the contenders run in an order rotated each round (--rounds), so that a load
that comes and goes on a shared machine does not fall on one contender only. Makespans come
from the trials' own timestamps in the database (first start to last end).
Usage: python scripts/bench_scheduling.py [--trials 200] [--only 1,2,3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _checkout import on_path

on_path()  # the test objectives (tests/objectives/__init__.py), here and in the study's processes

OBJECTIVES = "tests.objectives"
OFF = ("telemetry.enabled=false",)
ENV = {**os.environ, "HPO_TEST_SLEEP_S": "0.2", "COLUMNS": "120"}

# Optuna's processes get what the orchestrator's trials get: the random sampler, no pruner, a
# sqlite file in WAL mode with synchronous=NORMAL and a busy timeout (what the orchestrator sets
# on each connection, hpo_orchestrator/db/connect.py), and the same thread variables.
OPTUNA_WORKER = """
import sqlite3, sys, optuna, sqlalchemy
from sqlalchemy import event
from {module} import {name} as objective

@event.listens_for(sqlalchemy.engine.Engine, "connect")
def _tune(dbapi_connection, _record):
    if isinstance(dbapi_connection, sqlite3.Connection):
        for pragma in ("journal_mode=WAL", "busy_timeout=30000", "synchronous=NORMAL"):
            dbapi_connection.execute("PRAGMA " + pragma)

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="bench", storage=sys.argv[1],
                          sampler=optuna.samplers.RandomSampler(),
                          pruner=optuna.pruners.NopPruner())
study.optimize(objective, n_trials=int(sys.argv[2]))
"""


def _threads(par: int) -> str:
    """Threads per trial as the orchestrator sets them (scheduler.threads_per_trial unset)."""
    from hpo_orchestrator.placement import threads_per_trial

    return str(threads_per_trial(None, par))


def contenders_said(par: int, telemetry_rows: bool) -> str:
    """What each contender runs with, printed above its table."""
    threads = _threads(par)
    lines = [
        f"- every contender: sampler=random (seed unset), no pruner, a sqlite file (WAL, "
        f"synchronous=NORMAL), PAR={par}, OMP/MKL/OPENBLAS_NUM_THREADS={threads} per trial",
        "- hpo-orchestrator: one orchestrator process, telemetry off (Optuna's processes have "
        "none)" + ("; the 'telemetry on' row adds the default 1 s sampler, the difference being "
                   "the point of that row" if telemetry_rows else ""),
        f"- Optuna: {par} processes, each `load_study` + `optimize`, n_trials / {par} each",
    ]
    return "\n".join(lines)

ATTACH_AND_DECIDE = """
import sys, time, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
start = time.perf_counter()
study = optuna.load_study(study_name="bench", storage=sys.argv[1],
                          pruner=optuna.pruners.PatientPruner(optuna.pruners.HyperbandPruner(), 3))
trial = study.ask()
trial.suggest_float("p0", 0.0, 1.0)
trial.report(0.5, 0)
trial.should_prune()
print(time.perf_counter() - start)
study.tell(trial, 0.5)
"""


def _wal_db(path: Path) -> str:
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA journal_mode=WAL")
    return f"sqlite:///{path}"


def _makespan(db: Path, study: str = "bench") -> tuple[float, int]:
    with sqlite3.connect(db) as con:
        lo, hi, n = con.execute(
            "SELECT MIN(datetime_start), MAX(datetime_complete), COUNT(*) FROM trials t "
            "JOIN studies s USING (study_id) WHERE s.study_name = ? AND t.state = 'COMPLETE'",
            (study,)).fetchone()
    return (datetime.fromisoformat(hi) - datetime.fromisoformat(lo)).total_seconds(), n


def _remove_db(db: Path) -> None:
    """The previous contender's sqlite file and its WAL: a run's process may exit with its WAL
    still there, and a new file beside an old -wal/-shm failed to open ('disk I/O error')."""
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        path.unlink(missing_ok=True)


def hpo_run(work: Path, mode: str, objective: str, n: int, par: int, extra: tuple[str, ...] = ()
            ) -> tuple[float, int, float]:
    db = work / f"hpo-{mode}-{objective}.db"
    _remove_db(db)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
                    f"objective.target={OBJECTIVES}:{objective}", f"scheduler.parallel={par}",
                    f"scheduler.worker_mode={mode}", f"study.n_trials={n}", "study.name=bench",
                    "pruner=none", "sampler=random", f"storage.url=sqlite:///{db}", *extra],
                   check=True, env=ENV, stdout=subprocess.DEVNULL, cwd=work)
    wall = time.perf_counter() - start
    makespan, done = _makespan(db)
    return makespan, done, wall


def optuna_processes(work: Path, objective: str, n: int, par: int) -> tuple[float, int, float]:
    import optuna

    db = work / f"optuna-{objective}.db"
    _remove_db(db)
    url = _wal_db(db)
    optuna.create_study(study_name="bench", storage=url, sampler=optuna.samplers.RandomSampler())
    code = OPTUNA_WORKER.format(module=OBJECTIVES, name=objective)
    threads = _threads(par)
    env = {**ENV, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "OPENBLAS_NUM_THREADS": threads}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(n // par)], env=env)
             for _ in range(par)]
    for proc in procs:
        proc.wait()
    wall = time.perf_counter() - start
    makespan, done = _makespan(db)
    return makespan, done, wall


def ray_tune(n: int, par: int) -> tuple[float, int, float] | str:
    try:
        from ray import tune
    except ImportError:
        return "skipped: ray[tune] is not installed (pip install -e '.[bench]')"

    def trainable(config: dict) -> dict:  # type: ignore[type-arg]
        time.sleep(0.2)
        return {"loss": config["x"] ** 2}

    start = time.perf_counter()
    # Ray reserves 1 CPU per trial by default: on a 2-core machine that would run 2 at a time.
    # A sleeping trial needs none, so give each 1/par of what the machine has: par at a time.
    cpus = (os.cpu_count() or par) / par
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": cpus}),
                       param_space={"x": tune.uniform(0, 1)},
                       tune_config=tune.TuneConfig(num_samples=n, max_concurrent_trials=par))
    results = tuner.fit().get_dataframe()
    wall = time.perf_counter() - start
    # Makespan as for the others: first trial start to last trial end (Ray's own records).
    ends = results["timestamp"].astype(float)
    starts = ends - results["time_total_s"].astype(float)
    return float(ends.max() - starts.min()), len(results), wall


def _tag(round_no: int, rounds: int) -> str:
    return f" (round {round_no})" if rounds > 1 else ""


def _interleaved(contenders: dict[str, Any], rounds: int) -> list[tuple[str, str, Any]]:
    """(round tag, name, run) for every round, the order rotated each round, so that a load
    that comes and goes on a shared machine does not fall on one contender only."""
    names = list(contenders)
    order = []
    for r in range(rounds):
        shift = r % len(names)
        order += [(_tag(r + 1, rounds), n, contenders[n]) for n in names[shift:] + names[:shift]]
    return order


def first_decision(work: Path, n_trials: int) -> dict[str, Any]:
    """{contender: a run returning its seconds}, each on its own copy of one built study."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_status import build

    db = work / "decide.db"
    if not db.exists():
        build(db, n_trials)

    def orchestrator(mode: str) -> float:
        copy = work / f"decide-{mode}.db"
        shutil.copy(db, copy)
        subprocess.run([sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
                        f"objective.target={OBJECTIVES}:curves", "scheduler.parallel=1",
                        f"scheduler.worker_mode={mode}", f"study.n_trials={n_trials + 5}",
                        "study.name=bench", f"storage.url=sqlite:///{copy}"],
                       check=True, env=ENV, stdout=subprocess.DEVNULL, cwd=work)
        with sqlite3.connect(copy) as con:
            rows = con.execute(  # the trials this run added (the built ones have fake attrs)
                "SELECT a.value_json, b.value_json FROM trial_user_attributes a JOIN "
                "trial_user_attributes b ON a.trial_id = b.trial_id AND b.key = 'hpo.startup_s' "
                "JOIN trials t ON t.trial_id = a.trial_id "
                "WHERE a.key = 'hpo.first_decision_s' AND t.number >= ?", (n_trials,)).fetchall()
        assert len(rows) == 5, rows
        return statistics.median(float(d) - float(s) for d, s in rows)

    def optuna_attaching() -> float:
        copy = work / "decide-optuna.db"
        shutil.copy(db, copy)
        out = subprocess.run([sys.executable, "-c", ATTACH_AND_DECIDE, f"sqlite:///{copy}"],
                             check=True, capture_output=True, text=True, env=ENV)
        return float(out.stdout.strip())

    return {"reuse": lambda: orchestrator("reuse"), "fresh": lambda: orchestrator("fresh"),
            "optuna process attaching": optuna_attaching}


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=Path(__file__).parent).stdout
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--throughput-trials", type=int, default=400)
    parser.add_argument("--study-trials", type=int, default=20_000)
    parser.add_argument("--only", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each part this many times, the contenders' order rotated "
                             "each round (shared machines)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpo-bench-sched-"))
    which = set(args.only.split(","))
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}; command: python scripts/bench_scheduling.py "
          f"--trials {args.trials} --throughput-trials {args.throughput_trials} --only {args.only} "
          f"--rounds {args.rounds}; commit {_commit()}; load average {os.getloadavg()[0]:.1f} "
          "at start (other processes share this machine when it is above 0)")
    if "1" in which:
        ideal = args.trials * 0.2 / 4
        print(f"\n1. {args.trials} trials x 0.2 s sleep, PAR=4; ideal {ideal:.1f} s\n")
        print(contenders_said(4, telemetry_rows=True) + "\n- Ray Tune: its own random search, "
              "in-memory results, 4 concurrent actors\n")
        print("| contender | makespan s | over ideal | trials | wall s (incl. start-up) |")
        print("|---|---:|---:|---:|---:|")
        contenders = {
            "hpo-orchestrator reuse": lambda: hpo_run(work, "reuse", "sleepy", args.trials, 4, OFF),
            "hpo-orchestrator reuse, telemetry on":
                lambda: hpo_run(work, "reuse", "sleepy", args.trials, 4),
            "hpo-orchestrator fresh": lambda: hpo_run(work, "fresh", "sleepy", args.trials, 4, OFF),
            "Optuna, 4 processes, one sqlite (WAL)":
                lambda: optuna_processes(work, "sleepy", args.trials, 4),
            "Ray Tune, 4 concurrent": lambda: ray_tune(args.trials, 4),
        }
        for round_no, name, run in _interleaved(contenders, args.rounds):
            result = run()
            if isinstance(result, str):
                print(f"| {name} | {result} | | | |")
                continue
            makespan, done, wall = result
            print(f"| {name}{round_no} | {makespan:.2f} | {makespan / ideal - 1:+.1%} | {done} "
                  f"| {wall:.2f} |", flush=True)
    if "2" in which:
        n = args.throughput_trials
        print(f"\n2. {n} trials of a trivial objective with 10 reports, PAR=8, sqlite; trials/s "
              "by wall time (start-up included: the goals are stated by it) and by makespan "
              "(the trials' first start to last end)\n")
        print(contenders_said(8, telemetry_rows=True) + "\n- the orchestrator's reports reach "
              "the database up to storage.refresh_s late, in batches; Optuna's processes write "
              "each at once\n")
        print("| contender | wall s | trials/s by wall | vs Optuna (wall) | makespan s "
              "| trials/s by makespan | vs Optuna (makespan) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        base_name = "Optuna, 8 processes, one sqlite (WAL)"
        throughput = {
            base_name: lambda: optuna_processes(work, "reports10", n, 8),
            "hpo-orchestrator reuse": lambda: hpo_run(work, "reuse", "reports10", n, 8, OFF),
            "hpo-orchestrator reuse, telemetry on":
                lambda: hpo_run(work, "reuse", "reports10", n, 8),
            "hpo-orchestrator fresh": lambda: hpo_run(work, "fresh", "reports10", n, 8, OFF),
        }
        runs = _interleaved(throughput, args.rounds)
        for start in range(0, len(runs), len(throughput)):  # one round: printed once complete
            results = {name: (tag, run()) for tag, name, run in runs[start:start + len(throughput)]}
            _, (base_makespan, base_done, base_wall) = results[base_name]
            for name in throughput:  # the table in one order; the runs were rotated
                tag, (makespan, done, wall) = results[name]
                print(f"| {name}{tag} | {wall:.2f} | {done / wall:.1f} "
                      f"| {done / wall / (base_done / base_wall):.2f}x | {makespan:.2f} "
                      f"| {done / makespan:.1f} | {done / makespan / (base_done / base_makespan):.2f}x |",
                      flush=True)
    if "3" in which:
        print(f"\n3. first pruning decision on a study of {args.study_trials:,} trials "
              "(objective start to first should_prune answer, median of 5 trials)\n")
        print("| contender | seconds |")
        print("|---|---:|")
        for tag, name, run in _interleaved(first_decision(work, args.study_trials), args.rounds):
            print(f"| {name}{tag} | {run():.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
