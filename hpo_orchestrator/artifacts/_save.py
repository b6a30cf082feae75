"""``save_artifact(trial, path)``: the objective's call that keeps a file with its trial."""

from __future__ import annotations

import mimetypes
import os
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpo_orchestrator.artifacts._store import open_store
from hpo_orchestrator.worker import ARTIFACT_CALL, TrialProxy, artifact_store, orchestrator_link

__all__ = ["save_artifact"]


def save_artifact(trial: Any, file_path: str | os.PathLike[str], *, mimetype: str | None = None,
                  encoding: str | None = None, store: Any = None) -> str:
    """Keep ``file_path`` with ``trial`` in the artifact store; return its artifact id.

    In an orchestrated trial the file goes to the run's store (``artifacts.store``) and the
    orchestrator records Optuna's meta on the trial, as ``optuna.artifacts.upload_artifact``
    does (``get_all_artifact_meta`` and optuna-dashboard list it), plus ``hpo.artifacts``.
    Outside the orchestrator (a plain ``optuna.Trial``), it is ``upload_artifact`` into
    ``store`` (an Optuna artifact store), so the same objective runs under both.
    The file is copied: the objective may delete or overwrite it afterwards.
    """
    path = Path(file_path)
    if not path.is_file():
        raise FileNotFoundError(f"save_artifact: no file {str(file_path)!r} "
                                f"(relative to {os.getcwd()})")
    if not isinstance(trial, TrialProxy):
        if store is None:
            raise ValueError("save_artifact: outside an orchestrated trial, pass "
                             "store=optuna.artifacts.FileSystemArtifactStore(FOLDER)")
        from optuna.artifacts import upload_artifact

        return upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial,
                               mimetype=mimetype, encoding=encoding)
    link, folder = orchestrator_link(), artifact_store()
    if link is None or folder is None:
        raise RuntimeError("save_artifact: this trial's process has no artifact store")
    from optuna.artifacts import ArtifactMeta

    guessed_type, guessed_encoding = mimetypes.guess_type(path.name)
    meta = ArtifactMeta(artifact_id=str(uuid.uuid4()), filename=path.name,
                        mimetype=mimetype or guessed_type or "application/octet-stream",
                        encoding=encoding or guessed_encoding)
    # The bytes first, then the meta: a listed artifact is always there to fetch. A write that
    # fails (a full store, Ctrl-C) leaves no partial file behind. (Once the orchestrator was
    # asked to record it, the file stays: the meta may be in the database already.)
    try:
        with open(path, "rb") as source:
            open_store(folder).write(meta.artifact_id, source)
    except BaseException as exc:
        _remove_partial(Path(folder) / meta.artifact_id)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"save_artifact: cannot write {path.name!r} to the artifact "
                                     f"store {folder} ({exc.strerror or exc})") from exc
        raise
    status, payload = link.call(trial.number, ("call", ARTIFACT_CALL, (asdict(meta),), {}))
    if status == "err":
        raise payload
    return meta.artifact_id


def _remove_partial(stored: Path) -> None:
    try:
        stored.unlink(missing_ok=True)
    except OSError:
        pass  # the store's own trouble: the error being raised says it
