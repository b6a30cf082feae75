"""Where does the time go between launching a search and its first trial's objective call?

Runs, alternately and ``--repeat`` times each, (1) ``hpo-orchestrator run`` and (2) a plain
Optuna script (``study.optimize`` in one process: the benchmark's baseline without its
extras), both with a trivial objective that writes the moment it is entered and returns, on
a fresh sqlite study. For ours it prints a timeline of the orchestrator's start-up phases
(imports, configuration, GPUs, storage, study, first wave of workers, first spawn), each the
seconds since the launch; for both the launch-to-first-objective-call time. Nothing here
trains: the objectives' own start-up (torch, CUDA, data) is the same on both sides and is
left out. docs/quality/runs.md ("Ours' start-up") cites what it printed.

    python scripts/probe_startup.py --repeat 5 --out startup.json
    CUDA_VISIBLE_DEVICES=0,1 python scripts/probe_startup.py   # on a GPU host: GPU slots

Ours keeps its composed configuration between runs (config/_cache.py) under a cache folder of
the probe's own: other programs' runs on a shared machine (a test suite) would push it out of
the user's. Each side runs once untimed first, as a user's earlier run of the same command
did (ours composes its configuration then, both sides' files are read into memory).

Each phase is also timed in CPU seconds of ours' main process (``time.process_time``), and
each objective's call in CPU seconds of its process (ours: the worker; plain: the script),
figures that a loaded machine blurs less than wall times. The last line: each side's median
launch-to-objective time and their ratio.

``--trace`` (used by the probe itself): run the CLI in this process with the phase marks.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# (module, attribute, label): the start-up steps of runner.py and the scheduler, in order
PHASES = (("hpo_orchestrator.scheduler._first_wave", "FirstWave.start", "first wave started"),
          ("hpo_orchestrator.runner", "check_objective", "objective imported"),
          ("hpo_orchestrator.runner", "open_rdb_storage", "storage opened"),
          ("hpo_orchestrator.runner", "create_or_load_study", "study created"),
          ("hpo_orchestrator.runner", "Orchestrator", "orchestrator built"),
          ("hpo_orchestrator.scheduler.orchestrator", "Orchestrator._start_first_wave",
           "first wave ready"),
          ("hpo_orchestrator.scheduler.orchestrator", "Orchestrator._spawn", "first trial sent"))


def objective(trial: Any) -> float:
    """Writes the moment it is entered and its process's CPU seconds so far (PROBE_FILE),
    then returns at once."""
    with open(os.environ["PROBE_FILE"], "a") as out:
        out.write(f"{time.time()} {time.process_time()}\n")
    return trial.suggest_float("x", 0.0, 1.0)


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once the CLI has imported ``name``, before the importer goes on: the
    probe imports nothing earlier than the CLI does (the run imports its scheduler with the
    cycle collector off, cli/_run.py)."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            self.then()

        spec.loader.exec_module = exec_module
        return spec


def _trace(argv: list[str]) -> int:
    """The CLI in this process, each phase's end printed as seconds since PROBE_T0 and CPU
    seconds of this process. Each phase's module is patched once the CLI has imported it."""
    t0 = float(os.environ["PROBE_T0"])
    marks: list[tuple[str, float, float]] = [("python started", time.time() - t0,
                                              time.process_time())]
    import importlib

    import hpo_orchestrator.cli as cli
    marks.append(("CLI imported", time.time() - t0, time.process_time()))

    def patch(module_name: str, attribute: str, label: str, then: Any = None) -> None:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not any(m[0] == label for m in marks):  # the first call only
                marks.append((label, time.time() - t0, time.process_time()))
                if then is not None:
                    then()
            return result

        setattr(owner, name, timed)

    def patch_the_rest() -> None:
        for phase in PHASES[1:]:
            patch(*phase)

    sys.meta_path.insert(0, _OnImport(PHASES[0][0], lambda: patch(*PHASES[0], then=patch_the_rest)))
    try:
        return cli.main(argv)
    finally:
        print("PHASES " + json.dumps(marks), file=sys.stderr, flush=True)


PLAIN = """
import os, sys, time
t0 = float(os.environ["PROBE_T0"])
import optuna
sys.path.insert(0, {root!r})
from scripts.probe_startup import objective
imported = time.time() - t0
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(storage="sqlite:///" + os.environ["PROBE_DB"], study_name="probe")
created = time.time() - t0
study.optimize(objective, n_trials=1)
print("PHASES", [["imports", imported], ["study created", created]], file=sys.stderr)
"""


def once(kind: str, parent: Path) -> dict[str, Any]:
    # Each run in a folder of its own with the same relative paths: every run of ours has
    # the same overrides, as a user's runs of one command have.
    folder = parent / f"{kind}-{time.time_ns()}"
    folder.mkdir()
    stamp = folder / "entered.txt"
    db = folder / "probe.db"
    env = {**os.environ, "PROBE_FILE": str(stamp), "PROBE_DB": str(db),
           "XDG_CACHE_HOME": str(parent / "cache"),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if kind == "ours":
        command = [sys.executable, __file__, "--trace", "run", "objective=custom",
                   "objective.target=scripts.probe_startup:objective", "study.n_trials=1",
                   "storage.url=sqlite:///probe.db", "scheduler.log_dir=runs"]
    else:
        command = [sys.executable, "-c", PLAIN.format(root=str(ROOT))]
    env["PROBE_T0"] = repr(time.time())
    t0 = float(env["PROBE_T0"])
    done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True, check=False)
    total = time.time() - t0
    phases = [line for line in done.stderr.splitlines() if line.startswith("PHASES ")]
    entered_at, cpu = (float(x) for x in stamp.read_text().split()[:2]) if stamp.exists() \
        else (None, None)
    entered = None if entered_at is None else entered_at - t0
    if entered is None:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    marks = json.loads(phases[-1][7:].replace("'", '"')) if phases else []
    return {"kind": kind, "objective_entered_s": entered, "objective_process_cpu_s": cpu,
            "exit_s": total, "returncode": done.returncode,
            "phases": [mark[:2] for mark in marks],
            "phases_main_cpu_s": [mark[2] for mark in marks if len(mark) > 2]}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--trace":
        return _trace(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write every run's figures here (JSON)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("ours", "optuna"):  # untimed: a user's earlier run of the same command
            once(kind, Path(tmp))
        for i in range(args.repeat):
            for kind in ("ours", "optuna"):
                one = once(kind, Path(tmp))
                results.append(one)
                steps = ", ".join(f"{label} {at:.2f}" for label, at in one["phases"])
                cpu = one["phases_main_cpu_s"]
                entered = one["objective_entered_s"]
                print(f"{i + 1} {kind:6s} objective entered "
                      f"{'never' if entered is None else f'{entered:.2f} s'} "
                      f"(exit {one['exit_s']:.2f} s): {steps}"
                      + (f"; CPU s of the main process at each: "
                         f"{', '.join(f'{c:.2f}' for c in cpu)}" if cpu else "")
                      + (f"; objective's process CPU {one['objective_process_cpu_s']:.2f} s"
                         if entered is not None else ""), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    medians = {kind: statistics.median(r["objective_entered_s"] for r in results
                                       if r["kind"] == kind and r["objective_entered_s"])
               for kind in ("ours", "optuna") if any(r["kind"] == kind and r["objective_entered_s"]
                                                      for r in results)}
    if len(medians) == 2:
        print(f"median of {args.repeat}: ours {medians['ours']:.2f} s, plain Optuna "
              f"{medians['optuna']:.2f} s: {medians['ours'] / medians['optuna']:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
