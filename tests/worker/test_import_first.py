"""A trial's process imports what the orchestrator names first (worker/_env.IMPORT_FIRST).

On a GPU host a LightGBM built from source (its CUDA learner) crashed with SIGSEGV in its
first Dataset in every process that had loaded numpy or scikit-learn before it (docs/GPU.md),
so the LightGBM objective's processes import LightGBM before the worker's own imports.
"""

from __future__ import annotations

import pytest

from hpo_orchestrator.config import CustomObjectiveConfig, LightGBMObjectiveConfig
from hpo_orchestrator.scheduler._workers import first_imports
from hpo_orchestrator.worker import ChildEnv
from tests.conftest import trial_rows

TARGET = "objective.target=tests.objectives:import_order"


def test_the_lightgbm_objective_asks_for_lightgbm_first_and_others_for_nothing() -> None:
    assert first_imports(LightGBMObjectiveConfig()) == ("lightgbm",)
    assert first_imports(CustomObjectiveConfig(target="x:y")) == ()
    env = ChildEnv(trial_number=1, attempt=1, slot=0, gpu_index=None, gpu_uuid=None,
                   cuda_visible_devices="", num_threads=2, import_first=("lightgbm",))
    rendered = env.render()
    assert rendered["HPO_IMPORT_FIRST"] == "lightgbm"
    assert ChildEnv.parse(rendered).import_first == ("lightgbm",)
    assert "HPO_IMPORT_FIRST" not in ChildEnv.parse({}).render()


@pytest.mark.slow
def test_the_worker_imports_what_it_is_asked_before_its_own_imports(cli) -> None:  # type: ignore[no-untyped-def]
    asked = cli("run", "objective=custom", TARGET, "study.n_trials=1", "pruner=none",
                env={"HPO_IMPORT_FIRST": "lightgbm"})
    assert asked.code == 0, asked.stderr
    plain = cli("run", "objective=custom", TARGET, "study.n_trials=1", "pruner=none",
                "study.name=plain")
    assert plain.code == 0, plain.stderr
    [with_first] = trial_rows(asked.db)
    [without] = trial_rows(plain.db, "plain")
    assert with_first["attrs"]["test.lightgbm_before_numpy"] is True
    assert without["attrs"]["test.lightgbm_before_numpy"] is False  # the worker's imports came first
