"""The orchestrator's half of ``save_artifact``: the child wrote a file into the store and asks
for its meta to be recorded on the trial.

Recorded the way ``optuna.artifacts.upload_artifact`` records it (trial system attr
``artifacts:<id>`` holding the JSON of ``ArtifactMeta``), so ``get_all_artifact_meta`` and
optuna-dashboard find it, and listed in ``hpo.artifacts`` with the store's folder, so
``hpo-orchestrator artifacts`` knows where to fetch it even after ``artifacts.store`` changed.
The child is not trusted (docs/DESIGN.md §3.8): the meta is checked and the file must be there.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from hpo_orchestrator.scheduler._trial import RunningTrial

__all__ = ["record_artifact"]

_ATTR_PREFIX = "artifacts:"  # optuna.artifacts._upload.ARTIFACTS_ATTR_PREFIX


def _checked_meta(args: tuple[Any, ...]) -> dict[str, Any]:
    meta = args[0] if len(args) == 1 else None
    if not isinstance(meta, dict) or set(meta) != {"artifact_id", "filename", "mimetype", "encoding"}:
        raise ValueError("record_artifact: expected the artifact's meta "
                         "(artifact_id, filename, mimetype, encoding)")
    try:
        if str(uuid.UUID(str(meta["artifact_id"]))) != meta["artifact_id"]:
            raise ValueError
    except ValueError:
        raise ValueError(f"record_artifact: not an artifact id: {str(meta['artifact_id'])[:80]!r}") \
            from None
    if not isinstance(meta["filename"], str) or not meta["filename"] or "/" in meta["filename"] \
            or not isinstance(meta["mimetype"], str) \
            or not (meta["encoding"] is None or isinstance(meta["encoding"], str)):
        raise ValueError("record_artifact: filename and mimetype must be text (a file name, "
                         "no folder), encoding text or None")
    return meta


def record_artifact(rt: RunningTrial, args: tuple[Any, ...]) -> str:
    """Record the artifact the trial's child stored; return its id (the child's reply)."""
    meta = _checked_meta(args)
    if rt.artifact_store is None:
        raise RuntimeError("save_artifact: this run has no artifact store")
    if not (Path(rt.artifact_store) / meta["artifact_id"]).is_file():
        raise FileNotFoundError(f"save_artifact: {meta['filename']!r} is not in the artifact store "
                                f"{rt.artifact_store} (written elsewhere?)")
    trial = rt.trial
    trial.storage.set_trial_system_attr(trial._trial_id, _ATTR_PREFIX + meta["artifact_id"],
                                        json.dumps(meta))
    rt.artifacts.append({"artifact_id": meta["artifact_id"], "filename": meta["filename"],
                         "store": rt.artifact_store})
    trial.set_user_attr("hpo.artifacts", list(rt.artifacts))
    return str(meta["artifact_id"])
