"""The artifact store: a folder, through Optuna's ``FileSystemArtifactStore``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hpo_orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from optuna.artifacts import FileSystemArtifactStore

__all__ = ["check_store", "open_store", "prepare_store"]


def open_store(folder: str | Path) -> FileSystemArtifactStore:
    from optuna.artifacts import FileSystemArtifactStore

    return FileSystemArtifactStore(Path(folder))


def _refused(path: Path, why: str) -> ConfigError:
    return ConfigError(f"artifacts.store: cannot write to {path} ({why})",
                       "give a folder this user can write, e.g. artifacts.store=/shared/hpo-artifacts")


def check_store(folder: str | Path) -> Path:
    """The store's folder, absolute, if it is or can be made a writable folder; checked without
    writing anything, so a refused run leaves no trace (the storage is not even opened yet)."""
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise _refused(path, f"{existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _refused(path, f"{existing} is not writable")
    return path


def prepare_store(folder: str | Path) -> Path:
    """The store's folder, created and proven writable before any trial runs (a trial that
    trains for an hour must not fail at its last line over a read-only share)."""
    path = check_store(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise _refused(path, str(exc.strerror or exc)) from None
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"artifacts.store: cannot read {path}",
                          "give a folder this user can read and write")
    return path
