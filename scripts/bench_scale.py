#!/usr/bin/env python3
"""Benchmark: the run loop on big studies (issue 18), contenders interleaved in one run.

1. ``startup``: seconds from ``hpo-orchestrator run`` (a new process) to its first trial
   started on a slot, on an empty study (what start-up costs whatever the size) and on a copy
   of a study of N finished trials (built by bulk SQL, as in bench_status.py, with its
   tally; and once more without it, as a study of an older version is at its first run), against
   Optuna's own ``load_study`` + ``optimize`` (a new process) to its first trial's
   ``datetime_start`` on another copy (``--optuna-startup``: minutes at 100k).
2. ``cpu``: the orchestrator process's CPU time per trial (children excluded; sqlite's work
   is in-process, so included) between the 20th and the last trial of a run of trivial trials
   (``reports10``, PAR=4), on an empty study and on a copy of the N-trial study.
3. ``db``: database statements and transactions per trial, counted with SQLAlchemy's
   ``before_cursor_execute`` and ``commit`` events (plus the pool's connections), between the
   20th and the last trial: this orchestrator against Optuna's own ``study.optimize`` on the
   same objective (10 reports), on sqlite and, with ``--postgres URL``, on PostgreSQL.

4. ``cluster`` (with ``--postgres``): 8 orchestrators x 4 CPU slots (separate processes,
   hosts and lease folders) on one PostgreSQL study of trivial trials: wall time, trials/s,
   the server's commits and statements per trial (pg_stat_database, pg_stat_statements when
   installed), the most connections held at once (pg_stat_activity), and the check that the
   study has exactly n_trials trials, none RUNNING and none ``lost``.

Usage: python scripts/bench_scale.py [--trials 100000] [--run 200] [--only startup,cpu,db]
       [--optuna-startup] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
Prints Markdown tables (paste them into docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

from _checkout import on_path

on_path()  # the test objectives (tests/objectives/__init__.py), here and in the study's processes

OBJECTIVE = "tests.objectives:reports10"
OPTUNA_FIRST_TRIAL = """
import sys, optuna
from tests.objectives import reports10
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="bench", storage=sys.argv[1],
                          sampler=optuna.samplers.RandomSampler())
study.optimize(reports10, n_trials=1)
"""


def _first_new_start(db: Path, above: int) -> datetime:
    with sqlite3.connect(db) as con:
        (first,) = con.execute("SELECT MIN(datetime_start) FROM trials WHERE trial_id > ?",
                               (above,)).fetchone()
    return datetime.fromisoformat(first)


def _hpo_first_trial_s(db: Path, before: int) -> float:
    launched = datetime.now()
    subprocess.run([sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
                    f"objective.target={OBJECTIVE}", "study.name=bench",
                    f"study.n_trials={before + 4}", "scheduler.parallel=2", "sampler=random",
                    "pruner=none", f"storage.url=sqlite:///{db}"], check=True,
                   stdout=subprocess.DEVNULL)
    return (_first_new_start(db, before) - launched).total_seconds()


def startup(work: Path, big: Path, n: int, with_optuna: bool) -> list[tuple[str, float]]:
    # The same command on an empty study first: what start-up costs whatever the study's size.
    empty = work / "startup-empty.db"
    empty.unlink(missing_ok=True)
    rows = [("hpo-orchestrator run (new process), empty study", _hpo_first_trial_s(empty, 0))]
    from bench_status import build_tally

    copy = work / "startup-hpo.db"
    shutil.copy(big, copy)
    build_tally(copy)  # as a study this version has run keeps it (tally/_tally.py)
    rows.append(("hpo-orchestrator run (new process)", _hpo_first_trial_s(copy, n)))
    copy = work / "startup-older.db"  # no tally yet: the run's start builds it, once
    shutil.copy(big, copy)
    rows.append(("hpo-orchestrator run (new process), first run on a study of an older "
                 "version (builds the tally)", _hpo_first_trial_s(copy, n)))
    if with_optuna:
        copy = work / "startup-optuna.db"
        shutil.copy(big, copy)
        launched = datetime.now()
        subprocess.run([sys.executable, "-c", OPTUNA_FIRST_TRIAL, f"sqlite:///{copy}"], check=True)
        rows.append(("Optuna load_study + optimize (new process)",
                     (_first_new_start(copy, n) - launched).total_seconds()))
    return rows


class _Counts:
    """Statements, commits and connections of every SQLAlchemy engine in this process."""

    def __init__(self) -> None:
        self.statements = self.commits = self.connects = 0

    @contextmanager
    def listening(self) -> Iterator[_Counts]:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine
        from sqlalchemy.pool import Pool

        def on_statement(*_: Any) -> None:
            self.statements += 1

        def on_commit(*_: Any) -> None:
            self.commits += 1

        def on_connect(*_: Any) -> None:
            self.connects += 1

        hooks = [(Engine, "before_cursor_execute", on_statement), (Engine, "commit", on_commit),
                 (Pool, "connect", on_connect)]
        for target, name, fn in hooks:
            event.listen(target, name, fn)
        try:
            yield self
        finally:
            for target, name, fn in hooks:
                event.remove(target, name, fn)

    def snapshot(self) -> tuple[int, int, int, float]:
        return self.statements, self.commits, self.connects, time.process_time()


class _Marks:
    """A reporter that snapshots the counters at the 20th and the last finished trial."""

    def __init__(self, counts: _Counts, n: int) -> None:
        self.counts, self.n, self.done = counts, n, 0
        self.marks: dict[int, tuple[int, int, int, float]] = {}

    def started(self, rt: Any) -> None:
        pass

    def tick(self, running: Any) -> None:
        pass

    def setting_up(self, workers: int, elapsed_s: float) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def finished(self, done: Any) -> None:
        self.done += 1
        if self.done in (20, self.n):
            self.marks[self.done] = self.counts.snapshot()

    def per_trial(self) -> tuple[float, float, int, float]:
        (s0, c0, _, t0), (s1, c1, k1, t1) = self.marks[20], self.marks[self.n]
        trials = self.n - 20
        return (s1 - s0) / trials, (c1 - c0) / trials, k1, (t1 - t0) / trials * 1000


def hpo_in_process(url: str, n: int, par: int, counts: _Counts) -> _Marks:
    from hpo_orchestrator import run_study
    from hpo_orchestrator.config import load_config

    total = n
    if url.startswith("sqlite:///") and Path(url[10:]).exists():
        with sqlite3.connect(url[10:]) as con:
            total += con.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    marks = _Marks(counts, n)
    config = load_config(["objective=custom", f"objective.target={OBJECTIVE}", "study.name=bench",
                          f"study.n_trials={total}", f"scheduler.parallel={par}", "sampler=random",
                          "pruner=none", f"storage.url={url}"])
    with counts.listening():
        run_study(config, progress=lambda _prepared: nullcontext(marks))
    return marks


def optuna_in_process(url: str, n: int, counts: _Counts) -> _Marks:
    import optuna

    from tests.objectives import reports10

    marks = _Marks(counts, n)
    with counts.listening():
        study = optuna.create_study(study_name="bench", storage=url,
                                    sampler=optuna.samplers.RandomSampler(), load_if_exists=True)
        study.optimize(reports10, n_trials=n, callbacks=[lambda *_: marks.finished(None)])
    return marks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--run", type=int, default=200, help="trials per measured run")
    parser.add_argument("--only", default="startup,cpu,db")
    parser.add_argument("--optuna-startup", action="store_true")
    parser.add_argument("--postgres")
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    only = set(args.only.split(","))
    work = args.dir or Path(tempfile.mkdtemp(prefix="hpo-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    big = work / f"big{args.trials}.db"
    sys.path.insert(0, str(Path(__file__).parent))  # bench_status: the study builder
    if not big.exists():
        from bench_status import build

        build(big, args.trials)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; commit {commit}; command: python "
          f"scripts/bench_scale.py {' '.join(sys.argv[1:])}\n")
    if "startup" in only:
        print("| start-up on a study of N trials | N | seconds to the first trial |")
        print("|---|---:|---:|")
        for name, seconds in startup(work, big, args.trials, args.optuna_startup):
            print(f"| {name} | {0 if 'empty' in name else args.trials:,} | {seconds:.2f} |")
        print()
    if "cpu" in only:
        print(f"| orchestrator CPU per trial ({args.run} x reports10, PAR=4, sqlite) | study "
              "trials before | CPU ms per trial |")
        print("|---|---:|---:|")
        for label, source in (("empty study", None), ("big study", big)) * 2:
            db = work / f"cpu-{uuid.uuid4().hex[:6]}.db"
            if source is not None:
                shutil.copy(source, db)
            marks = hpo_in_process(f"sqlite:///{db}", args.run, 4, _Counts())
            print(f"| {label} | {0 if source is None else args.trials:,} | "
                  f"{marks.per_trial()[3]:.1f} |")
            db.unlink()
        print()
    if "db" in only:
        print("| database cost per trial (reports10) | storage | statements | transactions "
              "| connections opened | CPU ms |")
        print("|---|---|---:|---:|---:|---:|")
        urls = [("sqlite", lambda: f"sqlite:///{work / f'db-{uuid.uuid4().hex[:6]}.db'}")]
        if args.postgres:
            urls.append(("postgresql", lambda: _fresh_pg(args.postgres)))
        for backend, make in urls:
            for name in ("hpo-orchestrator PAR=4", "Optuna study.optimize"):
                url = make()
                marks = hpo_in_process(url, args.run, 4, _Counts()) if name.startswith("hpo") \
                    else optuna_in_process(url, args.run, _Counts())
                stmts, commits, connects, cpu = marks.per_trial()
                print(f"| {name} | {backend} | {stmts:.1f} | {commits:.1f} | {connects} | "
                      f"{cpu:.1f} |")
    if "cluster" in only and args.postgres:
        print(f"\n8 orchestrators x 4 slots, one PostgreSQL study of {args.run * 4} trials:")
        for key, value in cluster(_fresh_pg(args.postgres), args.run * 4).items():
            print(f"- {key}: {value}")
    return 0


def cluster(url: str, n: int, hosts: int = 8, par: int = 4) -> dict[str, Any]:
    import threading

    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    db_name = sqlalchemy.engine.make_url(url).database

    def server() -> tuple[int, int]:
        with engine.connect() as con:
            commits = con.execute(sqlalchemy.text(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = :d"), {"d": db_name}).scalar()
            return int(commits or 0), 0

    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        with engine.connect() as con:
            while not stop.wait(0.2):
                held = con.execute(sqlalchemy.text(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = :d"), {"d": db_name}).scalar()
                peak[0] = max(peak[0], int(held or 0))

    study = f"cluster-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="hpo-cluster-"))
    commits0, _ = server()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
         f"objective.target={OBJECTIVE}", f"study.name={study}", f"study.n_trials={n}",
         f"scheduler.parallel={par}", "scheduler.gpus=none", f"scheduler.host=node{i}",
         f"scheduler.lease_dir={work / f'leases{i}'}", "sampler=random", "pruner=none",
         f"storage.url={url}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(hosts)]
    codes = [proc.wait() for proc in procs]
    wall = time.perf_counter() - start
    stop.set()
    watcher.join()
    commits1, _ = server()
    with engine.connect() as con:
        states = dict(con.execute(sqlalchemy.text(
            "SELECT t.state, COUNT(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = :n GROUP BY t.state"), {"n": study}).all())
        lost = con.execute(sqlalchemy.text(
            "SELECT COUNT(*) FROM trial_user_attributes a JOIN trials t ON t.trial_id = a.trial_id "
            "JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = :n "
            "AND a.key = 'hpo.fail_reason' AND a.value_json = '\"lost\"'"), {"n": study}).scalar()
    engine.dispose()
    total = sum(states.values())
    return {"exit codes": codes, "states": {str(k).split(".")[-1]: v for k, v in states.items()},
            "trials": total, "lost": lost, "wall s": round(wall, 1),
            "trials/s": round(total / wall, 1),
            "server commits per trial (all clients)": round((commits1 - commits0) / total, 1),
            "connections held at most": peak[0]}


def _fresh_pg(url: str) -> str:
    """A new database on the server, so each contender starts from an empty study."""
    import sqlalchemy

    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as con:
        con.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return str(sqlalchemy.engine.make_url(url).set(database=name).render_as_string(
        hide_password=False))


if __name__ == "__main__":
    sys.exit(main())
