"""``hpo-orchestrator artifacts``: which trials' files (one trial, or the best), and fetching
them out of the store with Optuna's ``download_artifact``.

What a trial has is read with plain SQL: the artifact meta Optuna keeps on a trial (trial
system attrs ``artifacts:<id>``, as ``optuna.artifacts.upload_artifact`` writes them and
optuna-dashboard reads them) and the store folder this tool recorded for each
(``hpo.artifacts``, scheduler/_artifact_meta.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hpo_orchestrator.artifacts._store import open_store
from hpo_orchestrator.db import best_trials, has_trial, read_errors, rows, study_id_of
from hpo_orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hpo_orchestrator.db import Readable

__all__ = ["Fetched", "StoredArtifact", "download", "select", "trial_artifacts"]

_HINT_SAVE = "an objective keeps a file with hpo_orchestrator.save_artifact(trial, path)"

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


def trial_artifacts(connection: Readable, study_id: int,
                    numbers: set[int] | None = None) -> list[StoredArtifact]:
    """Every artifact of the study's trials (of ``numbers`` only, when given), in upload order."""
    stores: dict[str, str] = {}
    for number, value_json in rows(connection, _ARTIFACT_STORES_SQL, {"s": study_id}):
        if numbers is not None and int(number) not in numbers:
            continue
        listed = json.loads(value_json)
        for entry in listed if isinstance(listed, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("store"), str):
                stores[str(entry.get("artifact_id"))] = entry["store"]
    found = []
    for number, value_json in rows(connection, _ARTIFACT_META_SQL, {"s": study_id}):
        meta = _meta(value_json)
        if meta is None or (numbers is not None and int(number) not in numbers):
            continue
        artifact_id = meta["artifact_id"]
        found.append(StoredArtifact(int(number), artifact_id, str(meta.get("filename") or artifact_id),
                                    str(meta.get("mimetype") or "application/octet-stream"),
                                    meta.get("encoding"), stores.get(artifact_id)))
    return found


@dataclass(frozen=True)
class Fetched:
    """The artifacts of the chosen trials, in trial order then upload order."""

    study: str
    numbers: list[int]  # the trials chosen
    artifacts: list[StoredArtifact]


def select(engine: Engine, study: str | None, trial: int | None) -> Fetched:
    """The artifacts of trial ``trial``, or (None) of the best trial: the Pareto front's
    trials when the study has several objectives."""
    with read_errors(), engine.connect() as connection:
        study_id, name = study_id_of(connection, study)
        if trial is None:
            numbers = [t.number for t in best_trials(connection, study_id)[1]]
            if not numbers:
                raise ConfigError(f"study {name!r} has no COMPLETE trial yet, so no best trial",
                                  "pick a trial with --trial N")
        else:
            if not has_trial(connection, study_id, trial):
                raise ConfigError(f"study {name!r} has no trial #{trial}",
                                  f"'hpo-orchestrator status --study {name}' lists its trials")
            numbers = [trial]
        found = trial_artifacts(connection, study_id, set(numbers))
    return Fetched(name, numbers, found)


def _targets(fetched: Fetched, out: Path) -> list[tuple[StoredArtifact, Path]]:
    """Where each file goes: ``out/<filename>``, under ``out/trial-<N>/`` when several trials
    are fetched; a name a trial used twice gets its artifact id in front of the later copies."""
    taken: set[Path] = set()
    targets = []
    for artifact in fetched.artifacts:
        folder = out / f"trial-{artifact.number}" if len(fetched.numbers) > 1 else out
        # the name as a plain file name: a database is not trusted to pick folders for us
        name = Path(artifact.filename).name
        name = artifact.artifact_id if name in ("", ".", "..") else name
        target = folder / name
        if target in taken:
            target = folder / f"{artifact.artifact_id}-{name}"
        taken.add(target)
        targets.append((artifact, target))
    return targets


def download(fetched: Fetched, out: Path, store: Path | None = None) -> list[Path]:
    """Copy every artifact of ``fetched`` into ``out`` (nothing is overwritten: a file already
    there stops it before anything is copied). ``store`` replaces the folder each artifact was
    recorded with (the store moved, or was copied from a cluster)."""
    from optuna.artifacts import download_artifact

    if not fetched.artifacts:
        trials = ", ".join(f"#{n}" for n in fetched.numbers)
        raise ConfigError(f"study {fetched.study!r}: trial {trials} has no artifacts", _HINT_SAVE)
    targets = _targets(fetched, out)
    for artifact, target in targets:
        folder = store or (Path(artifact.store) if artifact.store else None)
        if folder is None:
            raise ConfigError(f"artifact {artifact.filename!r} of trial #{artifact.number} was not "
                              "stored by hpo-orchestrator: its store is unknown",
                              "give the folder of the Optuna artifact store with --store DIR")
        if not (folder / artifact.artifact_id).is_file():
            raise ConfigError(f"artifact {artifact.filename!r} of trial #{artifact.number} is not in "
                              f"the store {folder} (file {artifact.artifact_id} missing)",
                              "give the folder the store was moved or copied to with --store DIR")
        if target.exists():
            raise ConfigError(f"{target} already exists: nothing was fetched",
                              "fetch into another --out folder, or remove it first")
    for artifact, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        folder = store or Path(str(artifact.store))
        download_artifact(artifact_store=open_store(folder), artifact_id=artifact.artifact_id,
                          file_path=str(target))
    return [target for _, target in targets]
