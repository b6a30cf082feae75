from __future__ import annotations

import importlib
import os
import sys

from hpo_orchestrator.worker._env import ChildEnv

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

sys.exit(main(sys.argv[1:]))
