"""Record workload (c)'s learning curves with no pruner at 1, 2, 3 and 4 trials per GPU, all
at once, one GPU and one block of cores each: the input of scripts/sim_pruning.py.

    python scripts/record_curves.py OUT --seconds 120            # GPU host: GPUs 0-3
    HPO_ORCHESTRATOR_FAKE_GPUS=4 python scripts/record_curves.py /tmp/rec --seconds 40 --scale 0.02

Level K runs on GPU K-1 (``--gpus`` maps them otherwise): its own ``hpo-orchestrator run``
with ``CUDA_VISIBLE_DEVICES`` set to that GPU, pinned by ``taskset`` to its share of the
cores, ``pruner=none scheduler.trials_per_gpu=K``, the CNN objective, ``study.timeout_s``
(no trial starts after it; running ones get ``--grace`` seconds to finish their curves).
Then, per level, from its sqlite file: complete trials per minute of the run, epochs per
minute (every reported epoch, trials cut short included), the GPU's utilization while trials
ran (the mean of the hpo_telemetry table's whole-GPU samples, one per GPU and second), and
the median seconds per epoch and before the first (the ``hpo.step_s`` / ``hpo.overhead_s``
each trial recorded). Written to OUT: ``c-tpg<K>.db.gz`` (the studies, telemetry included),
``summary.json``, ``logs.tgz`` (the orchestrators' output and the trials' logs).
``HPO_QUALITY_SCALE`` (``--scale``) shrinks the CNN's data for a dry run without GPUs
(``HPO_ORCHESTRATOR_FAKE_GPUS``, docs/DESIGN.md §3.4).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchmarking.workloads import CNN_TARGET  # noqa: E402


def core_blocks(cores: list[int], parts: int) -> list[list[int]]:
    """``cores`` split into ``parts`` disjoint blocks, as even as they go (at least one each:
    with fewer cores than parts the blocks share, in turn)."""
    if len(cores) < parts:
        return [[cores[i % len(cores)]] for i in range(parts)]
    size, extra = divmod(len(cores), parts)
    blocks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        blocks.append(cores[start:end])
        start = end
    return blocks


def launch(out: Path, level: int, gpu: int, cores: list[int], seconds: float, grace: float,
           target: str, scale: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
            f"objective.target={target}", "pruner=none", f"scheduler.trials_per_gpu={level}",
            f"study.name=c-tpg{level}", f"storage.url=sqlite:///{out / f'c-tpg{level}.db'}",
            "study.n_trials=100000", f"study.timeout_s={seconds}", f"study.timeout_grace_s={grace}",
            f"sampler.seed={level}", f"scheduler.lease_dir={out / 'leases'}",
            f"scheduler.log_dir={out / 'logs'}"]
    pin = ["taskset", "-c", ",".join(map(str, cores))] if shutil.which("taskset") else []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "HPO_QUALITY_SCALE": str(scale), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    log = (out / "logs" / f"orchestrator-tpg{level}.log").open("w")
    return subprocess.Popen([*pin, *argv], cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_all(procs: list[subprocess.Popen[bytes]], deadline: float) -> list[int | None]:
    """Wait for the runs to end on their own (study.timeout_s); SIGTERM past ``deadline``,
    SIGKILL 15 s later."""
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.5)
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
        end = time.time() + wait
        while time.time() < end and any(p.poll() is None for p in procs):
            time.sleep(0.2)
    return [p.returncode for p in procs]


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def level_summary(db: Path, seconds: float) -> dict[str, Any]:
    """What one level's study shows (the module doc)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        states = dict(connection.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall())
        attrs: dict[str, list[float]] = {}
        for key, value, state in connection.execute(
                "SELECT a.key, a.value_json, t.state FROM trial_user_attributes a "
                "JOIN trials t USING (trial_id) WHERE a.key IN ('hpo.step_s', 'hpo.overhead_s')"):
            if state == "COMPLETE":
                attrs.setdefault(key, []).append(float(json.loads(value)))
        epochs = connection.execute("SELECT COUNT(*) FROM trial_intermediate_values").fetchone()[0]
        span = connection.execute(
            "SELECT (julianday(MAX(datetime_complete)) - julianday(MIN(datetime_start))) * 86400 "
            "FROM trials WHERE datetime_complete IS NOT NULL").fetchone()[0]
        # one whole-GPU sample per GPU and second: trials sharing a GPU report the same one
        util = connection.execute(
            "SELECT AVG(u) FROM (SELECT gpu_index, strftime('%s', ts) AS second, AVG(sm_util) AS u "
            "FROM hpo_telemetry WHERE sm_util IS NOT NULL AND gpu_index IS NOT NULL "
            "GROUP BY gpu_index, second)").fetchone()[0]
    complete = states.get("COMPLETE", 0)
    return {"complete": complete, "failed": states.get("FAIL", 0),
            "complete_per_min": round(complete / seconds * 60, 2),
            "epochs_per_min": round(epochs / seconds * 60, 2),
            "span_s": None if span is None else round(span, 1),
            "gpu_util": None if util is None else round(util, 1),
            "median_epoch_s": _median(attrs.get("hpo.step_s", [])),
            "median_overhead_s": _median(attrs.get("hpo.overhead_s", []))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=120.0, help="each run's study.timeout_s")
    parser.add_argument("--grace", type=float, default=20.0, help="for the running trials to end")
    parser.add_argument("--levels", default="1,2,3,4", help="trials per GPU, one run each")
    parser.add_argument("--gpus", default=None, help="one GPU per level (default 0, 1, ...)")
    parser.add_argument("--cpus", default=None, help="cores to split, e.g. 0-63 (default: this process's)")
    parser.add_argument("--scale", type=float, default=1.0, help="HPO_QUALITY_SCALE for the CNN's data")
    parser.add_argument("--target", default=CNN_TARGET)
    args = parser.parse_args(argv)

    levels = [int(k) for k in args.levels.split(",")]
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else list(range(len(levels)))
    if len(gpus) != len(levels):
        raise SystemExit(f"error: {len(levels)} levels need {len(levels)} GPUs, got --gpus {args.gpus}")
    if args.cpus:
        first, _, last = args.cpus.partition("-")
        cores = list(range(int(first), int(last or first) + 1))
    else:
        cores = sorted(os.sched_getaffinity(0))
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for stale in out.glob("c-tpg*.db*"):
        stale.unlink()
    blocks = core_blocks(cores, len(levels))
    started = time.time()
    procs = [launch(out, level, gpu, block, args.seconds, args.grace, args.target, args.scale)
             for level, gpu, block in zip(levels, gpus, blocks, strict=True)]
    codes = stop_all(procs, started + args.seconds + args.grace + 30.0)
    wall = time.time() - started
    summary: dict[str, Any] = {"seconds": args.seconds, "wall_s": round(wall, 1), "scale": args.scale,
                               "target": args.target, "levels": {}}
    for level, gpu, block, code in zip(levels, gpus, blocks, codes, strict=True):
        db = out / f"c-tpg{level}.db"
        row: dict[str, Any] = {"gpu": gpu, "cores": f"{block[0]}-{block[-1]}", "exit_code": code}
        if db.exists():
            with sqlite3.connect(db) as connection:  # a run killed with its WAL unmerged
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            row.update(level_summary(db, args.seconds))
            with db.open("rb") as src, gzip.open(f"{db}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            for path in out.glob(f"c-tpg{level}.db*"):
                if path.suffix != ".gz":
                    path.unlink()
        summary["levels"][str(level)] = row
        print(f"{level} per GPU (GPU {gpu}, cores {row['cores']}, exit {code}): "
              + ", ".join(f"{k} {v}" for k, v in row.items() if k not in ("gpu", "cores", "exit_code")),
              flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        tar.add(out / "logs", arcname="logs")
    shutil.rmtree(out / "logs")
    shutil.rmtree(out / "leases", ignore_errors=True)
    shutil.rmtree(out / "hpo-runs", ignore_errors=True)  # the studies' lock files
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
