"""Files a trial keeps (a model, a plot), in Optuna's artifact store.

The objective's process writes the file into the store itself (:func:`save_artifact`): the
bytes never cross the trial's pipe. The orchestrator then records Optuna's artifact meta on the
trial (system attr ``artifacts:<id>``, read by ``optuna.artifacts.get_all_artifact_meta`` and
optuna-dashboard) and ``hpo.artifacts``; ``hpo-orchestrator artifacts`` fetches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpo_orchestrator.artifacts._save import save_artifact
from hpo_orchestrator.artifacts._store import check_store, open_store, prepare_store

if TYPE_CHECKING:
    from hpo_orchestrator.artifacts._fetch import Fetched, download, select

__all__ = ["Fetched", "check_store", "download", "open_store", "prepare_store", "save_artifact", "select"]


def __getattr__(name: str) -> Any:
    """The fetching side (SQL reads) is loaded on first use: a trial's process needs only
    :func:`save_artifact`."""
    if name in ("Fetched", "download", "select"):
        from hpo_orchestrator.artifacts import _fetch

        return getattr(_fetch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
