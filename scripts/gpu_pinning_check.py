"""On a GPU host with 2+ GPUs: does a run given one GPU through CUDA_VISIBLE_DEVICES put every
trial on that GPU, as torch, NVML's process lists and LightGBM's OpenCL device each see it?

For each way of naming GPU 1 (its CUDA index with CUDA_DEVICE_ORDER=PCI_BUS_ID, its UUID, a
UUID prefix), a short study runs ``tests.objectives:pinning_probe`` (torch and LightGBM-GPU
trials) while a thread polls every GPU's compute-process list. Per trial it checks:
``hpo.gpu_uuid`` is GPU 1's, torch's device UUID is GPU 1's, the trial's process appeared in
GPU 1's process list and in no other. Results: OUT/pinning.json and a table on stdout.

Usage: python3 scripts/gpu_pinning_check.py --out DIR [--target-index 1] [--trials 6]
Exit 1 when any check fails (or fewer than 2 GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import pynvml
from _checkout import on_path

on_path()  # the test objectives (tests/objectives/__init__.py), here and in the study's processes


def _nvml_gpus() -> list[tuple[int, str, str]]:
    """(NVML index, UUID, PCI bus id) of every GPU."""
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
        gpus.append((index, uuid if isinstance(uuid, str) else uuid.decode(),
                     bus if isinstance(bus, str) else bus.decode()))
    return gpus


class _Watcher(threading.Thread):
    """pid -> the NVML indices whose compute-process list showed it."""

    def __init__(self, count: int) -> None:
        super().__init__(daemon=True)
        self.count = count
        self.seen: dict[int, set[int]] = defaultdict(set)
        self.stop = threading.Event()

    def run(self) -> None:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        while not self.stop.wait(0.05):
            for index, handle in enumerate(handles):
                try:
                    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                except pynvml.NVMLError:
                    continue
                for proc in procs:
                    self.seen[proc.pid].add(index)


def _trials(db: Path) -> list[dict[str, object]]:
    con = sqlite3.connect(db)
    rows = []
    for number, state, trial_id in con.execute("SELECT number, state, trial_id FROM trials ORDER BY number"):
        attrs = {k: json.loads(v) for k, v in con.execute(
            "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = ?", (trial_id,))}
        rows.append({"number": number, "state": state, "attrs": attrs})
    return rows


def _bare(uuid: object) -> str:
    return str(uuid or "").removeprefix("GPU-").lower()


def check(form: str, value: str, target: tuple[int, str, str], count: int, trials: int,
          workdir: Path) -> dict[str, object]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    watcher = _Watcher(count)
    watcher.start()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hpo_orchestrator", "run", "objective=custom",
         "objective.target=tests.objectives:pinning_probe", "pruner=none",
         "scheduler.parallel=2", f"study.n_trials={trials}", "telemetry.interval_s=0.2"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=400)
    watcher.stop.set()
    watcher.join()
    result: dict[str, object] = {"form": form, "CUDA_VISIBLE_DEVICES": value, "exit": proc.returncode,
                                 "wall_s": round(time.monotonic() - started, 1), "trials": []}
    if proc.returncode != 0:
        result["stderr"] = proc.stderr[-3000:]
    problems = []
    for row in _trials(workdir / "hpo.db"):
        attrs = row["attrs"]
        assert isinstance(attrs, dict)
        pid = attrs.get("hpo.pid")
        nvml_seen = sorted(watcher.seen.get(int(pid), set())) if isinstance(pid, int) else []
        entry = {"number": row["number"], "state": row["state"], "pid": pid,
                 "hpo.gpu_index": attrs.get("hpo.gpu_index"),
                 "hpo.cuda_visible_devices": attrs.get("hpo.cuda_visible_devices"),
                 "gpu_uuid_ok": _bare(attrs.get("hpo.gpu_uuid")) == _bare(target[1]),
                 "torch_uuid": attrs.get("test.torch_uuid"),
                 "opencl_platform": attrs.get("hpo.opencl_platform"),
                 "nvml_gpus_with_pid": nvml_seen,
                 "gpu_verified": attrs.get("hpo.gpu_verified")}
        if row["state"] != "COMPLETE":
            problems.append(f"trial {row['number']} {row['state']}: {attrs.get('hpo.error')}")
        if not entry["gpu_uuid_ok"]:
            problems.append(f"trial {row['number']}: hpo.gpu_uuid {attrs.get('hpo.gpu_uuid')}")
        if entry["torch_uuid"] is not None and _bare(entry["torch_uuid"]) != _bare(target[1]):
            problems.append(f"trial {row['number']}: torch computed on {entry['torch_uuid']}")
        if nvml_seen != [target[0]]:
            problems.append(f"trial {row['number']}: NVML saw its process on GPUs {nvml_seen}")
        result["trials"].append(entry)  # type: ignore[union-attr]
    result["problems"] = problems
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target-index", type=int, default=1)
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    pynvml.nvmlInit()
    gpus = _nvml_gpus()
    if len(gpus) < 2:
        print(f"needs 2+ GPUs, found {len(gpus)}")
        return 1
    target = gpus[args.target_index]
    # CUDA's index of the target under PCI_BUS_ID order: its rank by bus id.
    cuda_index = sorted(g[2] for g in gpus).index(target[2])
    forms = [("index", str(cuda_index)), ("uuid", target[1]), ("uuid-prefix", target[1][:12])]
    results = []
    for form, value in forms:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(check(form, value, target, len(gpus), args.trials, Path(tmp)))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpus": gpus, "target": target, "results": results}
    (args.out / "pinning.json").write_text(json.dumps(report, indent=2))
    print(f"target GPU {target[0]} {target[1]} ({target[2]})")
    print("| form | exit | trials | on target (hpo.gpu_uuid / torch / NVML pid) | problems |")
    print("|---|---|---|---|---|")
    for r in results:
        trials = r["trials"]
        assert isinstance(trials, list)
        ok = sum(1 for t in trials if t["gpu_uuid_ok"] and t["nvml_gpus_with_pid"] == [target[0]])
        print(f"| {r['form']} `{r['CUDA_VISIBLE_DEVICES']}` | {r['exit']} | {len(trials)} | "
              f"{ok}/{len(trials)} | {'; '.join(r['problems']) or 'none'} |")  # type: ignore[arg-type]
    return 1 if any(r["problems"] or r["exit"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
