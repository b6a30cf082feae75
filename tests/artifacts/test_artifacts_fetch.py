"""Where ``hpo-orchestrator artifacts`` puts the files it fetches (artifacts/_fetch.py): one
trial's into the folder, several trials' (a Pareto front) each under ``trial-<N>/``; a name a
trial used twice (a checkpoint saved each epoch) keeps every copy, the later ones with their
artifact id in front; a name is a plain file name (a database does not pick our folders); and
nothing is overwritten."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from hpo_orchestrator import artifacts
from hpo_orchestrator.errors import ConfigError

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(tmp_path: Path, epochs: int, directions: list[str] | None = None) -> tuple[
        sqlalchemy.Engine, Path, dict[int, list[bytes]]]:
    """Trials 0 and 1, each uploading ``ckpt.pt`` ``epochs`` times (different bytes each time)
    and one file whose recorded name tries to leave the folder; {number: bytes in upload order}."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(study_name="s", storage=url,
                                directions=directions or ["minimize"])
    kept: dict[int, list[bytes]] = {}
    for number in range(2):
        trial = study.ask()
        for epoch in range(epochs):
            path = tmp_path / "ckpt.pt"
            path.write_bytes(f"trial {number} epoch {epoch}".encode())
            upload_artifact(artifact_store=FileSystemArtifactStore(str(store)), file_path=str(path),
                            study_or_trial=trial)
            kept.setdefault(number, []).append(path.read_bytes())
        odd = tmp_path / "odd.txt"
        odd.write_bytes(f"odd {number}".encode())
        odd_id = upload_artifact(artifact_store=FileSystemArtifactStore(str(store)),
                                 file_path=str(odd), study_or_trial=trial)
        study._storage.set_trial_system_attr(  # the name another tool recorded
            trial._trial_id, f"artifacts:{odd_id}",
            {"artifact_id": odd_id, "filename": "../../escaped.txt", "mimetype": "text/plain",
             "encoding": None})
        kept[number].append(odd.read_bytes())
        values = [1.0 + number, 2.0 - number] if directions else 1.0 + number
        study.tell(trial, values)
    return sqlalchemy.create_engine(url), store, kept


def _fetched(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


def test_a_name_used_twice_keeps_every_copy(tmp_path: Path) -> None:
    engine, store, kept = _study(tmp_path, epochs=3)
    out = tmp_path / "out"
    fetched = artifacts.select(engine, "s", 0)
    paths = artifacts.download(fetched, out, store)
    assert len(set(paths)) == len(paths) == 4  # three checkpoints and the odd one
    assert _fetched(paths) == kept[0]  # each file its own bytes, in upload order
    assert paths[0] == out / "ckpt.pt"  # the first copy keeps its name
    ids = [a.artifact_id for a in fetched.artifacts]
    assert paths[1:3] == [out / f"{ids[1]}-ckpt.pt", out / f"{ids[2]}-ckpt.pt"]
    assert paths[3] == out / "escaped.txt"  # inside the folder, whatever the name said
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)


def test_several_trials_go_to_a_folder_each(tmp_path: Path) -> None:
    """Both objectives' trials are on the Pareto front: each trial's files in trial-<N>/."""
    engine, store, kept = _study(tmp_path, epochs=2, directions=["minimize", "minimize"])
    out = tmp_path / "out"
    fetched = artifacts.select(engine, "s", None)
    assert fetched.numbers == [0, 1]
    paths = artifacts.download(fetched, out, store)
    assert len(set(paths)) == len(paths) == 6
    for number in (0, 1):
        mine = [p for p in paths if p.parent == out / f"trial-{number}"]
        assert _fetched(mine) == kept[number]
        assert mine[0].name == "ckpt.pt"


def test_nothing_is_overwritten(tmp_path: Path) -> None:
    engine, store, _ = _study(tmp_path, epochs=2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "escaped.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists: nothing was fetched"):
        artifacts.download(artifacts.select(engine, "s", 1), out, store)
    assert [p.name for p in out.iterdir()] == ["escaped.txt"]  # not even the first file
    assert (out / "escaped.txt").read_text() == "mine"
