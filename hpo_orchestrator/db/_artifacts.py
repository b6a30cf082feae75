"""The reads behind ``hpo-orchestrator artifacts``: the artifact meta Optuna keeps on a trial
(trial system attrs ``artifacts:<id>``, as ``optuna.artifacts.upload_artifact`` writes them and
optuna-dashboard reads them) and the store folder this tool recorded for each (``hpo.artifacts``)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.engine import Connection

__all__ = ["StoredArtifact", "trial_artifacts"]

_ARTIFACT_META_SQL = (
    "SELECT t.number, a.value_json FROM trial_system_attributes a JOIN trials t "
    "ON t.trial_id = a.trial_id WHERE t.study_id = :s AND a.key LIKE 'artifacts:%' "
    "ORDER BY t.number, a.trial_system_attribute_id")
_ARTIFACT_STORES_SQL = (
    "SELECT t.number, a.value_json FROM trial_user_attributes a JOIN trials t "
    "ON t.trial_id = a.trial_id WHERE t.study_id = :s AND a.key = 'hpo.artifacts'")


class StoredArtifact(NamedTuple):
    number: int  # the trial's
    artifact_id: str
    filename: str
    mimetype: str
    encoding: str | None
    store: str | None  # the folder it was written to; None: uploaded by something else


def _meta(value_json: str) -> dict[str, Any] | None:
    """Optuna stores the meta as a JSON string inside the attr's JSON value."""
    try:
        value: Any = json.loads(value_json)
        if isinstance(value, str):
            value = json.loads(value)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("artifact_id"), str) else None


def trial_artifacts(connection: Connection, study_id: int,
                    numbers: set[int] | None = None) -> list[StoredArtifact]:
    """Every artifact of the study's trials (of ``numbers`` only, when given), in upload order."""
    stores: dict[str, str] = {}
    for number, value_json in connection.execute(text(_ARTIFACT_STORES_SQL), {"s": study_id}):
        if numbers is not None and int(number) not in numbers:
            continue
        listed = json.loads(value_json)
        for entry in listed if isinstance(listed, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("store"), str):
                stores[str(entry.get("artifact_id"))] = entry["store"]
    found = []
    for number, value_json in connection.execute(text(_ARTIFACT_META_SQL), {"s": study_id}):
        meta = _meta(value_json)
        if meta is None or (numbers is not None and int(number) not in numbers):
            continue
        artifact_id = meta["artifact_id"]
        found.append(StoredArtifact(int(number), artifact_id, str(meta.get("filename") or artifact_id),
                                    str(meta.get("mimetype") or "application/octet-stream"),
                                    meta.get("encoding"), stores.get(artifact_id)))
    return found

