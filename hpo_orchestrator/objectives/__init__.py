"""Built-in objectives. Each is a class built from its ``objective.*`` config and called with
a trial; they mark their phases and log ``hpo.params_effective``.

The data and search-space helpers are exported for the benchmarks (scripts.benchmarking).
The LightGBM device measurement is loaded on first use: a torch_mlp trial's process, which
imports this face, does not need it (32 ms: docs/DESIGN.md §3.2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpo_orchestrator.objectives._generated import binary_classification, held_out_test
from hpo_orchestrator.objectives._suggest import suggest_all

if TYPE_CHECKING:
    from hpo_orchestrator.objectives._device import cuda_learner_available

__all__ = ["binary_classification", "cuda_learner_available", "held_out_test", "suggest_all"]


def __getattr__(name: str) -> Any:
    if name == "cuda_learner_available":
        from hpo_orchestrator.objectives import _device

        return _device.cuda_learner_available
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
