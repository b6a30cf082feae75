"""Where does the time go between launching a search and its first trial's objective call?

Runs, alternately and ``--repeat`` times each, (1) ``hpo-orchestrator run`` and (2) a plain
Optuna script (``study.optimize`` in one process: the benchmark's baseline without its
extras), both with a trivial objective that writes the moment it is entered and returns, on
a fresh sqlite study. For ours it prints a timeline of the orchestrator's start-up phases
(imports, configuration, GPUs, storage, study, first wave of workers, first spawn), each the
seconds since the launch; for both the launch-to-first-objective-call time. Nothing here
trains: the objectives' own start-up (torch, CUDA, data) is the same on both sides and is
left out. docs/QUALITY.md ("Ours' start-up") cites what it printed.

    python scripts/probe_startup.py --repeat 5 --out startup.json
    CUDA_VISIBLE_DEVICES=0,1 python scripts/probe_startup.py   # on a GPU host: GPU slots

``--trace`` (used by the probe itself): run the CLI in this process with the phase marks.
"""

from __future__ import annotations

import argparse
import json
import os
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
          ("hpo_orchestrator.scheduler._launch", "Launching._start_first_wave",
           "first wave ready"),
          ("hpo_orchestrator.scheduler._launch", "Launching._spawn", "first trial sent"))


def objective(trial: Any) -> float:
    """Writes the moment it is entered (PROBE_FILE), then returns at once."""
    with open(os.environ["PROBE_FILE"], "a") as out:
        out.write(f"{time.time()}\n")
    return trial.suggest_float("x", 0.0, 1.0)


def _trace(argv: list[str]) -> int:
    """The CLI in this process, each phase's end printed as seconds since PROBE_T0. The
    modules past the first wave are patched once it has started (the CLI imports them next),
    so that the probe does not import them earlier than the CLI does."""
    t0 = float(os.environ["PROBE_T0"])
    marks: list[tuple[str, float]] = [("python started", time.time() - t0)]
    import importlib

    import hpo_orchestrator.cli as cli
    marks.append(("CLI imported", time.time() - t0))

    def patch(module_name: str, attribute: str, label: str, then: Any = None) -> None:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not any(m[0] == label for m in marks):  # the first call only
                marks.append((label, time.time() - t0))
                if then is not None:
                    then()
            return result

        setattr(owner, name, timed)

    def patch_the_rest() -> None:
        for phase in PHASES[1:]:
            patch(*phase)

    patch(*PHASES[0], then=patch_the_rest)
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
    entered = float(stamp.read_text().split()[0]) - t0 if stamp.exists() else None
    if entered is None:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    return {"kind": kind, "objective_entered_s": entered, "exit_s": total,
            "returncode": done.returncode,
            "phases": json.loads(phases[-1][7:].replace("'", '"')) if phases else []}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--trace":
        return _trace(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write every run's figures here (JSON)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for kind in ("ours", "optuna"):
                one = once(kind, Path(tmp))
                results.append(one)
                steps = ", ".join(f"{label} {at:.2f}" for label, at in one["phases"])
                entered = one["objective_entered_s"]
                print(f"{i + 1} {kind:6s} objective entered "
                      f"{'never' if entered is None else f'{entered:.2f} s'} "
                      f"(exit {one['exit_s']:.2f} s): {steps}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
