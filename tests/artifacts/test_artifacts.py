"""Files a trial keeps: ``save_artifact`` in the objective, Optuna's artifact meta on the trial
(what ``get_all_artifact_meta`` and optuna-dashboard read), ``hpo.artifacts``, and
``hpo-orchestrator artifacts`` fetching them byte for byte."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta

from hpo_orchestrator import save_artifact
from hpo_orchestrator.artifacts import prepare_store
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.scheduler._artifact_meta import record_artifact
from tests.conftest import run_cli

ARTIFACT_ID = "0b3e0d8c-6f0e-4a57-9a55-6f1c2f7f6a11"


def _meta(**changes: Any) -> dict[str, Any]:
    return {"artifact_id": ARTIFACT_ID, "filename": "model.txt", "mimetype": "text/plain",
            "encoding": None, **changes}


def _running(tmp_path: Path) -> SimpleNamespace:
    """What record_artifact reads of a RunningTrial: the orchestrator's real optuna.Trial."""
    study = optuna.create_study()
    store = tmp_path / "store"
    store.mkdir()
    return SimpleNamespace(trial=study.ask(), artifact_store=str(store), artifacts=[], study=study)


# --- the orchestrator's half: what a child asks to record ---------------------------------


def test_a_recorded_artifact_is_optunas_meta_and_hpo_artifacts(tmp_path: Path) -> None:
    rt = _running(tmp_path)
    (Path(rt.artifact_store) / ARTIFACT_ID).write_bytes(b"weights")
    assert record_artifact(rt, (_meta(),)) == ARTIFACT_ID  # type: ignore[arg-type]
    listed = get_all_artifact_meta(rt.trial)
    assert [(m.artifact_id, m.filename, m.mimetype) for m in listed] == \
        [(ARTIFACT_ID, "model.txt", "text/plain")]
    assert rt.trial.user_attrs["hpo.artifacts"] == [
        {"artifact_id": ARTIFACT_ID, "filename": "model.txt", "store": rt.artifact_store}]


@pytest.mark.parametrize(("args", "error"), [
    ((_meta(artifact_id="../../etc/passwd"),), "not an artifact id"),
    ((_meta(filename="../model.txt"),), "a file name, no folder"),
    ((_meta(extra=1),), "expected the artifact's meta"),
    (("model.txt",), "expected the artifact's meta"),
])
def test_a_childs_bad_meta_is_refused(tmp_path: Path, args: tuple[Any, ...], error: str) -> None:
    rt = _running(tmp_path)
    with pytest.raises(ValueError, match=error):
        record_artifact(rt, args)  # type: ignore[arg-type]
    assert get_all_artifact_meta(rt.trial) == [] and "hpo.artifacts" not in rt.trial.user_attrs


def test_meta_for_a_file_not_in_the_store_is_refused(tmp_path: Path) -> None:
    rt = _running(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape("'model.txt' is not in the artifact store")):
        record_artifact(rt, (_meta(),))  # type: ignore[arg-type]
    assert get_all_artifact_meta(rt.trial) == []


# --- the objective's call ------------------------------------------------------------------


def test_save_artifact_names_a_missing_file(tmp_path: Path) -> None:
    trial = optuna.create_study().ask()
    with pytest.raises(FileNotFoundError, match=re.escape("save_artifact: no file 'nope.pt'")):
        save_artifact(trial, "nope.pt", store=FileSystemArtifactStore(tmp_path))


def test_save_artifact_outside_a_run_needs_a_store(tmp_path: Path) -> None:
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(ValueError, match="pass store="):
        save_artifact(optuna.create_study().ask(), tmp_path / "m.txt")


def test_an_unwritable_store_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigError, match=re.escape("artifacts.store: cannot write to")):
        prepare_store(tmp_path / "file" / "artifacts")
    assert prepare_store(tmp_path / "new" / "artifacts").is_dir()


def test_run_refuses_an_unwritable_store_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    result = run_cli(tmp_path, "run", "study.n_trials=1", f"artifacts.store={tmp_path}/file/x")
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("error: artifacts.store: cannot write to") and "hint:" in result.stderr
    assert "Traceback" not in result.stderr and not result.db.exists()


# --- the command, on a study plain Optuna wrote ---------------------------------------------


def _plain_optuna_study(tmp_path: Path) -> Path:
    """Three trials whose objective kept a model file with save_artifact under plain Optuna
    (the store is then the user's, not recorded by us: fetching needs --store)."""
    store = tmp_path / "store"
    store.mkdir()

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -10, 10)
        path = tmp_path / f"model-{trial.number}.bin"
        path.write_bytes(json.dumps({"x": x}).encode() + bytes(range(256)))
        save_artifact(trial, path, store=FileSystemArtifactStore(store))
        return (x - 2) ** 2

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="plain", storage=f"sqlite:///{tmp_path}/hpo.db",
                                sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=3)
    return tmp_path / f"model-{study.best_trial.number}.bin"


def test_artifacts_command_fetches_the_best_trials_file(tmp_path: Path) -> None:
    best_file = _plain_optuna_study(tmp_path)
    listed = run_cli(tmp_path, "artifacts")
    assert listed.code == 0, listed.stderr
    assert best_file.name in listed.stdout and "store unknown" in listed.stdout
    fetched = run_cli(tmp_path, "artifacts", "--best", "--out", "out", "--store", "store")
    assert fetched.code == 0, fetched.stderr
    assert (tmp_path / "out" / best_file.name).read_bytes() == best_file.read_bytes()
    best = run_cli(tmp_path, "best")
    assert f"artifacts: {best_file.name}; fetch: " in best.stdout and "artifacts --study plain --best" \
        in best.stdout
    one = run_cli(tmp_path, "artifacts", "--trial", "0", "--json")
    assert [a["filename"] for a in json.loads(one.stdout)["artifacts"]] == ["model-0.bin"]


@pytest.mark.parametrize(("args", "error"), [
    (("--trial", "9", "--out", "o", "--store", "store"), "error: study 'plain' has no trial #9"),
    (("--out", "o"), "its store is unknown"),
    (("--out", "o", "--store", "elsewhere"), "is not in the store"),
    (("--out", "exists", "--store", "store"), "already exists: nothing was fetched"),
])
def test_artifacts_command_bad_input(tmp_path: Path, args: tuple[str, ...], error: str) -> None:
    best_file = _plain_optuna_study(tmp_path)
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / best_file.name).write_text("mine")
    result = run_cli(tmp_path, "artifacts", *args)
    assert result.code == 2 and error in result.stderr and "hint:" in result.stderr, result.stderr
    assert (tmp_path / "exists" / best_file.name).read_text() == "mine"


# --- a study run by the orchestrator --------------------------------------------------------

_OBJECTIVE = '''
import json
import re
import os

from hpo_orchestrator import save_artifact


def objective(trial):
    x = trial.suggest_float("x", -10, 10)
    path = f"model-{os.getpid()}.json"
    with open(path, "w") as handle:
        json.dump({"x": x, "trial": trial.number}, handle)
    save_artifact(trial, path)
    os.remove(path)  # the store keeps its own copy
    if trial.number == 3:
        save_artifact(trial, "never-written.pt")
    return (x - 2) ** 2
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reuse", "fresh"])
def test_a_runs_best_artifact_is_fetched_byte_identical(tmp_path: Path, mode: str) -> None:
    (tmp_path / "keeper.py").write_text(_OBJECTIVE)
    ran = run_cli(tmp_path, "run", "objective=custom", "objective.target=keeper:objective",
                  "study.name=keep", "study.n_trials=5", "scheduler.parallel=2",
                  f"scheduler.worker_mode={mode}", "study.fail_fast=0", "telemetry.enabled=false")
    assert ran.code == 0, ran.stderr
    storage = optuna.storages.RDBStorage(f"sqlite:///{ran.db}")
    study = optuna.load_study(study_name="keep", storage=storage)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.number for t in failed] == [3]
    assert "save_artifact: no file 'never-written.pt'" in failed[0].user_attrs["hpo.error"]
    best = study.best_trial
    metas = get_all_artifact_meta(best, storage=storage)
    assert [m.filename for m in metas] == [best.user_attrs["hpo.artifacts"][0]["filename"]]
    store = tmp_path / "hpo-runs" / "keep" / "artifacts"
    assert best.user_attrs["hpo.artifacts"][0]["store"] == str(store)

    fetched = run_cli(tmp_path, "artifacts", "--best", "--out", "best")
    assert fetched.code == 0, fetched.stderr
    got = tmp_path / "best" / metas[0].filename
    assert got.read_bytes() == (store / metas[0].artifact_id).read_bytes()
    assert json.loads(got.read_text()) == {"x": best.params["x"], "trial": best.number}
