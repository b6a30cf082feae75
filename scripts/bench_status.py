#!/usr/bin/env python3
"""Benchmark: `hpo-orchestrator status` on a large study, against `optuna trials`.

Builds sqlite studies of N finished trials (5 params, 20 intermediate values and 5 user
attrs each) by bulk SQL inserts in Optuna's own representation, plus the one narrow
``hpo_trial_summary`` row per trial that the orchestrator writes when it tells a trial; checks
that ``optuna.load_study`` reads them back, then times, in the same run:

- ``hpo-orchestrator status --json`` (a whole CLI process) on N trials and on M trials;
- the status queries alone (``collect_status`` in this process) on N trials;
- the same on a copy without ``hpo_trial_summary`` (a study run by plain Optuna);
- ``optuna trials -f json`` on M trials (it loads every trial through the ORM).

Usage: python scripts/bench_status.py [--trials 100000] [--optuna-trials 20000] [--dir DIR]
Prints a Markdown table (paste it into docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy

from hpo_orchestrator.db import ensure_tables

STUDY = "bench"
N_PARAMS, N_STEPS = 5, 20
DISTRIBUTION = json.dumps({"name": "FloatDistribution",
                           "attributes": {"step": None, "low": 0.0, "high": 1.0, "log": False}})


def build(db: Path, n_trials: int, seed: int = 0, chunk: int = 50_000) -> None:
    """An Optuna study of ``n_trials`` finished trials, written with executemany, ``chunk``
    trials per transaction (1M trials are 30M rows: built whole they would not fit in memory)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")  # creates the schema + versions
    study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], STUDY)
    storage.engine.dispose()
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    ensure_tables(engine)
    engine.dispose()
    rng = random.Random(seed)
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")  # a benchmark's scratch file: rebuilt if torn
        for first in range(0, n_trials, chunk):
            _insert(con, _rows(study_id, range(first, min(first + chunk, n_trials)), rng))
            con.commit()


def _rows(study_id: int, numbers: range, rng: random.Random) -> dict[str, list[tuple[object, ...]]]:
    t0 = datetime(2026, 1, 1)
    rows: dict[str, list[tuple[object, ...]]] = {
        "trials": [], "params": [], "values": [], "steps": [], "attrs": [], "summary": []}
    for i in numbers:
        tid = i + 1
        pruned = rng.random() < 0.5
        state = "PRUNED" if pruned else "COMPLETE"
        start = t0 + timedelta(seconds=30 * i / 8)
        end = start + timedelta(seconds=rng.uniform(20, 240))
        rows["trials"].append((tid, i, study_id, state, start.isoformat(" "), end.isoformat(" ")))
        for p in range(N_PARAMS):
            rows["params"].append((tid, f"p{p}", rng.random(), DISTRIBUTION))
        curve = [1.0 / (s + 1) + rng.random() * 0.1 for s in range(N_STEPS)]
        rows["steps"].extend((tid, s, curve[s], "FINITE") for s in range(N_STEPS))
        if not pruned:
            rows["values"].append((tid, 0, curve[-1], "FINITE"))
        startup, decision, util = rng.uniform(2, 4), rng.uniform(20, 40), rng.uniform(60, 95)
        rows["attrs"].extend([
            (tid, "hpo.host", json.dumps("bench-host")),
            (tid, "hpo.gpu_index", json.dumps(i % 2)),
            (tid, "hpo.startup_s", json.dumps(startup)),
            (tid, "hpo.first_decision_s", json.dumps(decision)),
            (tid, "hpo.gpu_util_mean", json.dumps(util)),
        ])
        rows["summary"].append((tid, study_id, i, state, "bench-host", i % 2, start.timestamp(),
                                end.timestamp(), startup, decision, N_STEPS - 1, util))
    return rows


def _insert(con: sqlite3.Connection, rows: dict[str, list[tuple[object, ...]]]) -> None:
    con.executemany("INSERT INTO trials (trial_id, number, study_id, state, datetime_start, "
                    "datetime_complete) VALUES (?, ?, ?, ?, ?, ?)", rows["trials"])
    con.executemany("INSERT INTO trial_params (trial_id, param_name, param_value, "
                    "distribution_json) VALUES (?, ?, ?, ?)", rows["params"])
    con.executemany("INSERT INTO trial_values (trial_id, objective, value, value_type) "
                    "VALUES (?, ?, ?, ?)", rows["values"])
    con.executemany("INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, "
                    "intermediate_value_type) VALUES (?, ?, ?, ?)", rows["steps"])
    con.executemany("INSERT INTO trial_user_attributes (trial_id, key, value_json) "
                    "VALUES (?, ?, ?)", rows["attrs"])
    con.executemany("INSERT INTO hpo_trial_summary (trial_id, study_id, number, state, host, "
                    "gpu_index, start_s, end_s, startup_s, first_decision_s, last_step, "
                    "gpu_util_mean) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows["summary"])


def check_readable(db: Path, n_trials: int) -> None:
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == n_trials, len(trials)
    first = trials[0]
    assert len(first.params) == N_PARAMS and len(first.intermediate_values) == N_STEPS
    assert len(first.user_attrs) == 5


def timed(cmd: list[str], repeat: int) -> float:
    """Best wall time of ``repeat`` runs of a command (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--optuna-trials", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="hpo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    big, small, plain = work / "big.db", work / "small.db", work / "big-plain.db"
    for db, n in ((big, args.trials), (small, args.optuna_trials)):
        if not db.exists():
            start = time.perf_counter()
            build(db, n)
            print(f"built {db} ({n} trials) in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    check_readable(small, args.optuna_trials)
    if not plain.exists():
        shutil.copy(big, plain)
        with sqlite3.connect(plain) as con:
            con.execute("DROP TABLE hpo_trial_summary")

    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.status import collect_status

    def query_seconds(db: Path) -> float:
        engine = create_engine(f"sqlite:///{db}")
        collect_status(engine, STUDY)  # warm the page cache, as a second `status` would be
        start = time.perf_counter()
        report = collect_status(engine, STUDY)
        seconds = time.perf_counter() - start
        assert sum(s.count for s in report.states.values()) == args.trials
        assert report.per_device and report.per_device[0].trials == args.trials // 2
        return seconds

    query_s, plain_s = query_seconds(big), query_seconds(plain)

    cli = [sys.executable, "-m", "hpo_orchestrator", "status", "--json", "--storage"]
    status_big = timed([*cli, f"sqlite:///{big}"], args.repeat)
    status_small = timed([*cli, f"sqlite:///{small}"], args.repeat)
    optuna_bin = shutil.which("optuna", path=os.path.dirname(sys.executable)) or "optuna"
    optuna_small = timed([optuna_bin, "trials", "--storage", f"sqlite:///{small}", "--study-name",
                          STUDY, "-f", "json"], 1)

    cores = os.cpu_count()
    print(f"\nmachine: {platform.node()}, {cores} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}; command: python scripts/bench_status.py "
          f"--trials {args.trials} --optuna-trials {args.optuna_trials}\n")
    print("| what | trials | seconds | vs optuna trials (same study) |")
    print("|---|---:|---:|---:|")
    print(f"| `hpo-orchestrator status --json` (whole process) | {args.trials:,} | {status_big:.2f} | |")
    print(f"| status queries alone (`collect_status`) | {args.trials:,} | {query_s:.2f} | |")
    print(f"| the same, study without `hpo_trial_summary` (plain Optuna) | {args.trials:,} | "
          f"{plain_s:.2f} | |")
    print(f"| `hpo-orchestrator status --json` (whole process) | {args.optuna_trials:,} | "
          f"{status_small:.2f} | {optuna_small / status_small:.0f}x faster |")
    print(f"| `optuna trials -f json` | {args.optuna_trials:,} | {optuna_small:.2f} | 1x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
