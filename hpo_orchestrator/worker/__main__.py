from __future__ import annotations

import gc
import importlib
import os
import sys

# The cycle collector off while our own imports (Optuna, numpy, the worker's modules) make
# the process's long-lived objects, which it would only rescan: 15-25 ms of a worker's
# 0.2 s of CPU to its first trial on the 2-core machine (docs/quality/runs.md, "Ours'
# start-up"). On again, those frozen, before the objective's own imports and setup.
gc.disable()

from hpo_orchestrator.worker._env import ChildEnv  # noqa: E402

# Before anything else (the bootstrap imports Optuna, and with it numpy): on a GPU host a
# LightGBM built from source (its CUDA learner) crashed with SIGSEGV in its first Dataset in
# every process that had loaded numpy or scikit-learn before LightGBM's library, and trained
# where LightGBM came first (docs/GPU.md). The orchestrator asks this for its LightGBM objective.
for _name in ChildEnv.parse(os.environ).import_first:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass  # the objective's own import says what is missing, in the trial's log

from hpo_orchestrator.worker._child import main  # noqa: E402

gc.freeze()
gc.enable()
sys.exit(main(sys.argv[1:]))
