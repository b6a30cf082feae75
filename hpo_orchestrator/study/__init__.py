"""The study as a run sees it: its set-up from the config, the run's Optuna storage, the kept
tally that ``status`` reads, and ``best``/``enqueue``.

Modules by concern:

- ``_setup``: sampler, pruner and study from the validated config, and the config recorded
  on the study (a resumed run is checked against it);
- ``_storage`` (over ``_mirror``, ``_passthrough``): ``MirrorStorage``, the run's Optuna
  storage: reads from an in-memory mirror of the study, writes through ``RDBStorage``
  (docs/DESIGN.md §3.2);
- ``_end``: a trial's end as a value (``TrialEnd``), written in the transaction of its tell;
- ``_tally``: the study's kept tally and its update at a trial's end (status reads it);
- ``_tools``: ``best`` and ``enqueue`` (and ``study.enqueue`` at a run's start).

Each name is imported from its module on first use (PEP 562), as db/ does: ``status`` reads
the tally without importing Optuna, a run's set-up imports all of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator._lazy import lazy_getattr

if TYPE_CHECKING:
    from hpo_orchestrator.study._end import Requeue, TrialEnd
    from hpo_orchestrator.study._setup import (
        build_sampler,
        create_or_load_study,
        objective_differences,
        record_config,
        without_pruning,
    )
    from hpo_orchestrator.study._storage import MirrorStorage
    from hpo_orchestrator.study._tally import VERSION as TALLY_VERSION
    from hpo_orchestrator.study._tally import DeviceTally, Tally
    from hpo_orchestrator.study._tally import advance as advance_tally
    from hpo_orchestrator.study._tally import trusted as trusted_tally
    from hpo_orchestrator.study._tools import (
        BestTrial,
        BestTrials,
        Enqueued,
        enqueue_command,
        enqueue_configured,
        enqueue_params,
        find_best,
        load_params,
        override_line,
        overrides,
    )

# name -> (module, its name there)
_MODULES = {
    **{name: ("_setup", name) for name in ("build_sampler", "create_or_load_study",
                                           "objective_differences", "record_config",
                                           "without_pruning")},
    "MirrorStorage": ("_storage", "MirrorStorage"),
    "Requeue": ("_end", "Requeue"),
    "TrialEnd": ("_end", "TrialEnd"),
    "TALLY_VERSION": ("_tally", "VERSION"),
    "DeviceTally": ("_tally", "DeviceTally"),
    "Tally": ("_tally", "Tally"),
    "advance_tally": ("_tally", "advance"),
    "trusted_tally": ("_tally", "trusted"),
    **{name: ("_tools", name) for name in ("BestTrial", "BestTrials", "Enqueued", "enqueue_command",
                                           "enqueue_configured", "enqueue_params", "find_best",
                                           "load_params", "override_line", "overrides")},
}


__getattr__ = lazy_getattr(__name__, _MODULES, globals())
# Every name of the table; the imports above name the same for type checkers
# (tests/test_imports.py checks that they agree).
__all__ = sorted(_MODULES)
