"""A worker's own start-up runs without the cycle collector (worker/__main__.py): its imports
(Optuna, numpy, ours) make the process's long-lived objects, which collections would only
rescan (15-25 ms of a worker's 0.2 s of CPU before its first trial on the 2-core machine,
docs/quality/runs.md "Ours' start-up"). The objective's own imports and setup run with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import cli_env, trial_rows

_WITH_THE_COLLECTOR = """
import gc
import hpo_orchestrator.worker._child
print(gc.get_stats()[1]["collections"])
"""


@pytest.mark.slow
def test_a_worker_imports_without_the_collector_and_its_objective_with_it(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", "objective=custom", "objective.target=tests.objectives:collections_so_far",
               "study.n_trials=1", "pruner=none")
    assert done.code == 0, done.stderr
    [row] = trial_rows(done.db)
    at_import = row["attrs"]  # when the worker imported the objective's module
    assert at_import["test.collector_on"] is True
    assert at_import["test.frozen"] > 0  # ours: the collections of its setup skip them
    # the same imports with the collector on make several collections of the middle
    # generation; the worker's, only before its __main__ turns it off (importing its package)
    with_it = int(subprocess.run([sys.executable, "-c", _WITH_THE_COLLECTOR], env=cli_env(),
                                 check=True, capture_output=True, text=True).stdout)
    assert at_import["test.collections"][1] <= with_it / 2, (at_import, with_it)
