"""The artifact store: a folder, through Optuna's ``FileSystemArtifactStore``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hpo_orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from optuna.artifacts import FileSystemArtifactStore

__all__ = ["open_store", "prepare_store"]


def open_store(folder: str | Path) -> FileSystemArtifactStore:
    from optuna.artifacts import FileSystemArtifactStore

    return FileSystemArtifactStore(Path(folder))


def prepare_store(folder: str | Path) -> Path:
    """The store's folder, created and proven writable before any trial runs (a trial that
    trains for an hour must not fail at its last line over a read-only share)."""
    path = Path(folder).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"artifacts.store: cannot write to {path} ({exc.strerror or exc})",
                          "give a folder this user can write, e.g. artifacts.store=/shared/hpo-artifacts") \
            from None
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"artifacts.store: cannot read {path}",
                          "give a folder this user can read and write")
    return path
