#!/usr/bin/env python3
"""Benchmark: `hpo-orchestrator status` on a large study, against `optuna trials`.

Builds sqlite studies of N finished trials (5 params, 20 intermediate values and 5 user
attrs each) by bulk SQL inserts in Optuna's own representation, plus the one narrow
``hpo_trial_summary`` row per trial that the orchestrator writes when it tells a trial; checks
that ``optuna.load_study`` reads them back, then times, in the same run:

- ``hpo-orchestrator status --json`` (a whole CLI process) on N trials and on M trials;
- the status queries alone (``collect_status`` in this process) on N trials;
- the same without the study's tally (status folds every trial into a fresh one), and what
  building the tally costs once (a run's start on a study of an older version does it);
- the same on a copy without ``hpo_trial_summary`` (a study an older version ran: its trials
  have ``hpo.*`` attrs);
- ``status --json`` on a study plain Optuna wrote (the same trials, their attrs under keys of
  the user's own, none of our tables), and with ``--first-run`` the seconds from launching
  ``hpo-orchestrator run`` on a copy of it (default sampler and pruner) to its first trial's
  start: the run's start summarizes every trial once;
- ``optuna trials -f json`` on M trials (it loads every trial through the ORM).

With ``--baseline CHECKOUT`` (e.g. ``git worktree add /tmp/base <commit>``) the same commands
of that checkout are timed alternately with this tree's; ``--read-commands`` adds ``report``
and ``tune-pruner`` with their default flags.

With ``--real-run N``, also a study of N trials made by a real run (its tally folded trial by
trial as the run told them): status from that tally, checked equal to a fresh fold of every
trial.

Usage: python scripts/bench_status.py [--trials 100000] [--optuna-trials 20000] [--dir DIR]
       [--baseline CHECKOUT] [--read-commands] [--real-run N] [--first-run] [--timeout 300]
Prints a Markdown table (paste it into docs/benchmarks/status.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy
from _checkout import on_path

from hpo_orchestrator.db.tables import ensure_tables
from hpo_orchestrator.status import StatusReport

on_path()  # the test objectives (tests/objectives/__init__.py), here and in the study's processes

STUDY = "bench"
REPO = Path(__file__).resolve().parents[1]
N_PARAMS, N_STEPS = 5, 20
DISTRIBUTION = json.dumps({"name": "FloatDistribution",
                           "attributes": {"step": None, "low": 0.0, "high": 1.0, "log": False}})


def build(db: Path, n_trials: int, seed: int = 0, chunk: int = 50_000,
          ours: bool = True) -> None:
    """An Optuna study of ``n_trials`` finished trials, written with executemany, ``chunk``
    trials per transaction (1M trials are 30M rows: built whole they would not fit in memory).
    ``ours``: as the orchestrator leaves it (hpo.* attrs, summary rows); else as plain Optuna
    (the same attrs under the user's own keys, none of our tables)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")  # creates the schema + versions
    study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], STUDY)
    storage.engine.dispose()
    if ours:
        engine = sqlalchemy.create_engine(f"sqlite:///{db}")
        ensure_tables(engine)
        engine.dispose()
    rng = random.Random(seed)
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")  # a benchmark's scratch file: rebuilt if torn
        for first in range(0, n_trials, chunk):
            _insert(con, _rows(study_id, range(first, min(first + chunk, n_trials)), rng, ours))
            con.commit()


def _rows(study_id: int, numbers: range, rng: random.Random,
          ours: bool) -> dict[str, list[tuple[object, ...]]]:
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
        prefix = "hpo." if ours else "my."
        rows["attrs"].extend([
            (tid, f"{prefix}host", json.dumps("bench-host")),
            (tid, f"{prefix}gpu_index", json.dumps(i % 2)),
            (tid, f"{prefix}startup_s", json.dumps(startup)),
            (tid, f"{prefix}first_decision_s", json.dumps(decision)),
            (tid, f"{prefix}gpu_util_mean", json.dumps(util)),
        ])
        if ours:
            rows["summary"].append((tid, study_id, i, state, "bench-host", i % 2,
                                    start.timestamp(), end.timestamp(), startup, decision,
                                    N_STEPS - 1, util))
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
    if rows["summary"]:
        con.executemany("INSERT INTO hpo_trial_summary (trial_id, study_id, number, state, host, "
                        "gpu_index, start_s, end_s, startup_s, first_decision_s, last_step, "
                        "gpu_util_mean) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        rows["summary"])


def build_tally(db: Path) -> float:
    """The indexes and the tally a run's start makes on a study without them (runner.py):
    seconds, once per database."""
    from hpo_orchestrator.db import study_id_of
    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.tally import advance_tally as advance

    with sqlite3.connect(db) as con:  # from scratch, as on a study without one
        con.execute("DROP TABLE IF EXISTS hpo_study_tally")
        for index in ("duration", "startup", "decision", "flagged", "failed"):
            con.execute(f"DROP INDEX IF EXISTS ix_hpo_summary_{index}")
    start = time.perf_counter()
    engine = create_engine(f"sqlite:///{db}", read_only=False)
    ensure_tables(engine)
    with engine.begin() as connection:
        advance(connection, study_id_of(connection, STUDY)[0], STUDY, rebuild=True)
    engine.dispose()
    return time.perf_counter() - start


def check_readable(db: Path, n_trials: int) -> None:
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == n_trials, len(trials)
    first = trials[0]
    assert len(first.params) == N_PARAMS and len(first.intermediate_values) == N_STEPS
    assert len(first.user_attrs) == 5


def real_run(work: Path, n_trials: int) -> tuple[Path, str]:
    """A study made by a real run (`hpo-orchestrator run`, a fast objective whose curves get
    pruned, two at a time, reuse workers): its tally folded trial by trial as the run told
    them, not rebuilt at once. Returns the database and the run's wall seconds."""
    db = work / f"real{n_trials}.db"
    if db.exists():
        return db, "kept from an earlier call"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
                    "objective.target=tests.objectives:curves",
                    f"study.name={STUDY}", f"storage.url=sqlite:///{db}",
                    f"study.n_trials={n_trials}", "scheduler.parallel=2", "scheduler.gpus=none",
                    "scheduler.worker_mode=reuse", "telemetry.enabled=false",
                    f"scheduler.lease_dir={work / 'leases'}"],
                   check=True, stdout=subprocess.DEVNULL, cwd=work,
                   env={**os.environ, "HPO_TEST_STEP_S": "0"})
    return db, f"{time.perf_counter() - start:.0f} s"


def first_trial_s(study: Path, work: Path) -> float:
    """Seconds from launching ``hpo-orchestrator run`` (default sampler and pruner, two slots)
    on a copy of ``study`` to its first new trial's start (datetime_start: the run's clock)."""
    copy = work / f"{study.stem}-first-run.db"
    shutil.copy(study, copy)
    with sqlite3.connect(copy) as con:
        (top,) = con.execute("SELECT MAX(trial_id) FROM trials").fetchone()
    launched = datetime.now()
    subprocess.run([sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
                    "objective.target=tests.objectives:reports10", f"study.name={STUDY}",
                    f"study.n_trials={top + 4}", "scheduler.parallel=2", "telemetry.enabled=false",
                    f"storage.url=sqlite:///{copy}", f"scheduler.lease_dir={work / 'leases'}"],
                   check=True, stdout=subprocess.DEVNULL, cwd=work)
    with sqlite3.connect(copy) as con:
        (first,) = con.execute("SELECT MIN(datetime_start) FROM trials WHERE trial_id > ?",
                               (top,)).fetchone()
    for leftover in (copy, copy.with_name(copy.name + "-wal"), copy.with_name(copy.name + "-shm")):
        leftover.unlink(missing_ok=True)
    return (datetime.fromisoformat(first) - launched).total_seconds()


def status_json(db: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "hpo_orchestrator", "status", "--json",
                          "--storage", f"sqlite:///{db}"], check=True, capture_output=True,
                         text=True, cwd=REPO).stdout
    return json.loads(out)


def timed(cmd: list[str], repeat: int, cwd: Path | None = None,
          timeout: float | None = None) -> tuple[float, float]:
    """Best wall time and best CPU time (user + system, its processes) of ``repeat`` runs of a
    command, in seconds; inf if it ran past ``timeout``. On a shared machine the CPU time is
    the steadier of the two: the wall time grows with the load average."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        try:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd, timeout=timeout)
        except subprocess.TimeoutExpired:
            return float("inf"), float("inf")
        best = min(best, time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best_cpu = min(best_cpu, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return best, best_cpu


Times = tuple[float, float]


def alternated(cmd: list[str], baseline: Path | None, repeat: int,
               timeout: float | None = None) -> tuple[Times, Times | None]:
    """Best times of this tree's command and of the baseline checkout's (run from its folder,
    so that its package is the one imported), one after the other ``repeat`` times, so that
    both meet the same load on a shared machine."""
    mine, theirs = (float("inf"), float("inf")), (float("inf"), float("inf"))
    for _ in range(repeat):
        wall, cpu = timed(cmd, 1, REPO, timeout)
        mine = (min(mine[0], wall), min(mine[1], cpu))
        if baseline is not None:
            wall, cpu = timed(cmd, 1, baseline, timeout)
            theirs = (min(theirs[0], wall), min(theirs[1], cpu))
    return mine, None if baseline is None else theirs


def _seconds(value: Times | None, timeout: float | None) -> str:
    if value is None:
        return "-"
    wall, cpu = value
    return f"> {timeout:.0f}" if wall == float("inf") else f"{wall:.2f} ({cpu:.2f} CPU)"


def _comparable(status: dict[str, object]) -> dict[str, object]:
    """A status without what differs between two reads of one study (the clock's readings)."""
    return {k: v for k, v in status.items() if k not in ("now", "generated_at", "age_s")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--optuna-trials", type=int, default=20_000,
                        help="the study `optuna trials` reads (0: skip it)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="a checkout of an older commit: its commands are timed too, "
                             "alternating with this tree's")
    parser.add_argument("--read-commands", action="store_true",
                        help="time report and tune-pruner (default flags) too")
    parser.add_argument("--real-run", type=int, default=0, metavar="N",
                        help="also a study of N trials made by a real run (its tally folded "
                             "trial by trial): status from it, checked against a fresh fold of every trial")
    parser.add_argument("--first-run", action="store_true",
                        help="time a run's first trial on a copy of the plain Optuna study")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds after which a command is stopped and reported as '> T'")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="hpo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    big = work / ("big.db" if args.trials == 100_000 else f"big{args.trials}.db")
    small, older = work / "small.db", big.with_name(big.stem + "-older.db")
    plain = big.with_name(big.stem + "-optuna.db")  # plain Optuna's: none of our attrs or tables
    for db, n, ours in ((big, args.trials, True), (small, args.optuna_trials, True),
                        (plain, args.trials, False)):
        if n and not db.exists():
            start = time.perf_counter()
            build(db, n, ours=ours)
            print(f"built {db} ({n} trials) in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.optuna_trials:
        check_readable(small, args.optuna_trials)
    if args.trials <= 100_000 and not older.exists():  # a copy of 1M trials is 2 GB more
        shutil.copy(big, older)
        with sqlite3.connect(older) as con:
            con.execute("DROP TABLE hpo_trial_summary")

    tally_s = build_tally(big)

    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.status import collect, collect_status

    def query_seconds(db: Path, kept: bool = True, ours: bool = True) -> float:
        engine = create_engine(f"sqlite:///{db}", read_only=kept)

        def collect_once() -> StatusReport:
            if kept:
                return collect_status(engine, STUDY)
            with engine.connect() as connection, connection.begin() as transaction:
                # without its tally (rolled back): status folds every trial into a fresh one
                connection.execute(sqlalchemy.text("DELETE FROM hpo_study_tally"))
                report = collect(connection, STUDY)
                transaction.rollback()
                return report

        collect_once()  # warm the page cache, as a second `status` would be
        start = time.perf_counter()
        report = collect_once()
        seconds = time.perf_counter() - start
        assert sum(s.count for s in report.states.values()) == args.trials
        if ours:  # plain Optuna's trials ran on no device of ours
            assert report.per_device and report.per_device[0].trials == args.trials // 2
        return seconds

    query_s = query_seconds(big)
    full_s = query_seconds(big, kept=False)
    older_s = query_seconds(older) if older.exists() else None
    plain_query_s = query_seconds(plain, ours=False)

    module = [sys.executable, "-m", "hpo_orchestrator"]
    storage = ["--storage", f"sqlite:///{big}"]
    status_big, status_base = alternated([*module, "status", "--json", *storage], args.baseline,
                                         args.repeat)
    status_plain, status_plain_base = alternated(
        [*module, "status", "--json", "--storage", f"sqlite:///{plain}"], args.baseline,
        args.repeat)
    rows = [("`hpo-orchestrator status --json` (whole process)", status_big, status_base),
            ("the same, a study plain Optuna wrote (no summary table, no `hpo.*` attr)",
             status_plain, status_plain_base)]
    if args.read_commands:
        out = work / "bench-report.html"
        for what, command, repeat in (
                ("`hpo-orchestrator report --out r.html` (whole process)",
                 [*module, "report", "--out", str(out), *storage], 1),
                ("`hpo-orchestrator tune-pruner --json` (whole process)",
                 [*module, "tune-pruner", "--json", *storage], 1)):
            mine, theirs = alternated(command, args.baseline, repeat, args.timeout)
            rows.append((what, mine, theirs))

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    base = "" if args.baseline is None else subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=args.baseline).stdout.strip()
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.1f} at the end; "
          f"commit {commit}; command: python scripts/bench_status.py {' '.join(sys.argv[1:])}\n")
    print(f"| what | trials | wall s (CPU s), this tree {commit} | wall s (CPU s), baseline {base or '-'} |")
    print("|---|---:|---:|---:|")
    for what, mine, theirs in rows:
        print(f"| {what} | {args.trials:,} | {_seconds(mine, args.timeout)} | "
              f"{_seconds(theirs, args.timeout)} |")
    print(f"| status queries alone (`collect_status`, in process) | {args.trials:,} | {query_s:.3f} | |")
    print(f"| the same without a tally (a fresh fold of every trial) | {args.trials:,} | {full_s:.2f} | |")
    print(f"| building the tally and indexes (once, at a run's start) | {args.trials:,} | {tally_s:.2f} | |")
    if older_s is not None:
        print(f"| the same, a study an older version ran (`hpo.*` attrs, no `hpo_trial_summary`) "
              f"| {args.trials:,} | {older_s:.2f} | |")
    print(f"| status queries alone, the study plain Optuna wrote | {args.trials:,} | "
          f"{plain_query_s:.2f} | |")
    if args.first_run:
        print(f"| `hpo-orchestrator run` on a copy of the study plain Optuna wrote: seconds to "
              f"its first trial's start | {args.trials:,} | {first_trial_s(plain, work):.1f} | |")
    if args.real_run:
        real, took = real_run(work, args.real_run)
        kept = status_json(real)
        visited = real.with_name(real.stem + "-visited.db")
        visited.unlink(missing_ok=True)
        with sqlite3.connect(real) as source, sqlite3.connect(visited) as con:
            source.backup(con)  # with the WAL's pages (a file copy would miss the last trials)
            con.execute("DROP TABLE hpo_study_tally")  # no tally: status folds every trial afresh
        same = _comparable(kept) == _comparable(status_json(visited))
        if not same:
            print(f"error: status from the run's tally differs from a fresh fold ({real})",
                  file=sys.stderr)
        status_real = timed([*module, "status", "--json", "--storage", f"sqlite:///{real}"],
                            args.repeat, REPO)
        print(f"| `hpo-orchestrator status --json`, a real run's study (tally folded trial by "
              f"trial; the run took {took}) | {args.real_run:,} | {_seconds(status_real, None)} | "
              f"{'equal to a fresh fold' if same else 'DIFFERS from a fresh fold'} |")
        if not same:
            return 1
    if args.optuna_trials:
        status_small = timed([*module, "status", "--json", "--storage", f"sqlite:///{small}"],
                             args.repeat, REPO)[0]
        optuna_bin = shutil.which("optuna", path=os.path.dirname(sys.executable)) or "optuna"
        optuna_small = timed([optuna_bin, "trials", "--storage", f"sqlite:///{small}", "--study-name",
                              STUDY, "-f", "json"], 1)[0]
        print(f"| `hpo-orchestrator status --json` (whole process) | {args.optuna_trials:,} | "
              f"{status_small:.2f} | ({optuna_small / status_small:.0f}x faster than optuna trials) |")
        print(f"| `optuna trials -f json` | {args.optuna_trials:,} | {optuna_small:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
