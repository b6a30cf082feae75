"""A run starts up without the cycle collector and loops with it (cli/_run.py): start-up makes
the process's long-lived objects (Optuna's, SQLAlchemy's, Alembic's, ours), which its full
and young collections only rescanned: 0.11-0.13 s of the main process's 0.8 s of CPU before
the first trial on the 2-core machine (docs/quality/runs.md, "Ours' start-up")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

# Each collection while the run runs (the main thread under _run_command), by whether the run
# had printed its first line (devices, study, trial logs: then its loop begins) or not yet.
_COLLECTIONS = """
import gc, sys, threading
from pathlib import Path
from hpo_orchestrator.cli import main

class Printed:
    def __init__(self, out):
        self.out, self.any = out, False
    def write(self, text):
        self.any = self.any or bool(text)
        return self.out.write(text)
    def __getattr__(self, name):
        return getattr(self.out, name)

sys.stdout = printed = Printed(sys.stdout)
main_thread = threading.main_thread().ident
seen = []

def where(phase, info):
    if phase != "start":
        return
    names, frame = set(), sys._current_frames().get(main_thread)
    while frame is not None:
        names.add((Path(frame.f_code.co_filename).name, frame.f_code.co_name))
        frame = frame.f_back
    if ("_run.py", "_run_command") in names:
        seen.append("loop" if printed.any else "start-up")

gc.callbacks.append(where)
code = main(sys.argv[1:])
gc.callbacks.remove(where)
print(code, seen.count("start-up"), seen.count("loop"), gc.isenabled(), gc.get_freeze_count())
"""


@pytest.mark.slow
def test_a_run_collects_no_cycles_while_it_starts_and_does_in_its_loop(tmp_path: Path) -> None:
    """And a caller in-process (tests, a notebook) gets its collector back as it was, with
    nothing left frozen."""
    done = subprocess.run(
        [sys.executable, "-c", _COLLECTIONS, "run", "objective=custom",
         "objective.target=tests.objectives:quadratic", "study.n_trials=6", "pruner=none",
         "storage.url=sqlite:///hpo.db"],
        env=cli_env(), cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False)
    code, starting, looping, on, frozen = done.stdout.split()[-5:]
    assert code == "0", done.stderr
    assert int(starting) == 0
    assert int(looping) > 0
    assert (on, frozen) == ("True", "0")
