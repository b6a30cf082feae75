"""The composed configuration kept between runs (config/_cache.py): a start with the same
inputs skips Hydra, and anything composition reads changes the answer as Hydra would."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpo_orchestrator.config import _cache, config_dir, load_config, to_plain_dict
from hpo_orchestrator.errors import ConfigError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPO_ORCHESTRATOR_CONFIG_CACHE", raising=False)
    return tmp_path / "xdg" / "hpo-orchestrator" / "config"


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.pickle")) if cache.is_dir() else []


def test_a_second_start_needs_no_hydra(cache: Path) -> None:
    code = ("import sys; from hpo_orchestrator.config import load_config; "
            "c = load_config(['study.n_trials=7', 'pruner=median']); "
            "print(c.study.n_trials, c.pruner.name, 'hydra' in sys.modules, 'omegaconf' in sys.modules)")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache.parents[1])}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            check=True)
    assert first.stdout.split() == ["7", "median", "True", "True"]
    assert second.stdout.split() == ["7", "median", "False", "False"]
    assert len(_entries(cache)) == 1


@pytest.mark.parametrize("overrides", [
    [], ["objective=torch_mlp", "study.name=b"], ["pruner=hyperband", "sampler=random"],
    ["objective.search_space.learning_rate.low=0.001", "study.enqueue=[{learning_rate: 0.1}]"],
])
def test_the_kept_config_is_hydras(cache: Path, overrides: list[str]) -> None:
    composed = to_plain_dict(load_config(overrides))
    assert len(_entries(cache)) == 1
    assert to_plain_dict(load_config(overrides)) == composed
    assert len(_entries(cache)) == 1  # read, not written again


def test_other_overrides_are_other_entries(cache: Path) -> None:
    assert load_config(["study.n_trials=5"]).study.n_trials == 5
    assert load_config(["study.n_trials=6"]).study.n_trials == 6
    assert load_config(["study.n_trials=5"]).study.n_trials == 5
    assert len(_entries(cache)) == 2


def test_a_changed_config_file_is_composed_again(cache: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(config_dir(), conf)
    monkeypatch.setenv("HPO_ORCHESTRATOR_CONF", str(conf))
    assert load_config([]).study.n_trials == 40
    text = (conf / "config.yaml").read_text()
    (conf / "config.yaml").write_text(text.replace("n_trials: 40", "n_trials: 41"))
    assert load_config([]).study.n_trials == 41
    (conf / "pruner" / "median.yaml").write_text("defaults:\n  - base_median\n\nn_warmup_steps: 7\n")
    assert load_config(["pruner=median"]).pruner.n_warmup_steps == 7


def test_interpolations_are_left_to_hydra(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPO_CACHE_TEST_NAME", "first")
    assert load_config(["study.name=${oc.env:HPO_CACHE_TEST_NAME}"]).study.name == "first"
    monkeypatch.setenv("HPO_CACHE_TEST_NAME", "second")
    assert load_config(["study.name=${oc.env:HPO_CACHE_TEST_NAME}"]).study.name == "second"
    assert _entries(cache) == []


def test_hydra_overrides_and_the_off_switch_are_not_kept(cache: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    load_config([f"hydra.searchpath=[file://{tmp_path}]"])
    monkeypatch.setenv("HPO_ORCHESTRATOR_CONFIG_CACHE", "0")
    load_config([])
    assert _entries(cache) == []


def test_validation_runs_on_the_kept_copy(cache: Path, tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    data.write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    overrides = [f"objective.data={data}", "objective.target_column=y"]
    load_config(overrides)
    data.unlink()
    assert len(_entries(cache)) == 1
    with pytest.raises(ConfigError, match=r"rows\.csv"):
        load_config(overrides)


def test_a_broken_or_foreign_entry_is_composed_again(cache: Path) -> None:
    load_config(["study.n_trials=9"])
    (entry,) = _entries(cache)
    entry.write_bytes(b"not a pickle")
    assert load_config(["study.n_trials=9"]).study.n_trials == 9
    poisoned = load_config(["study.n_trials=9"])
    poisoned.study.name = "poisoned"
    entry.write_bytes(pickle.dumps(poisoned))
    if os.getuid() == 0:  # another user's file is never read
        os.chown(entry, 65534, 65534)
        assert load_config(["study.n_trials=9"]).study.name == "hpo"
    entry.write_bytes(pickle.dumps({"not": "a config"}))
    assert load_config(["study.n_trials=9"]).study.name == "hpo"


def test_an_unwritable_cache_folder_only_costs_the_composition(cache: Path) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder would be")
    assert load_config(["study.n_trials=4"]).study.n_trials == 4


def test_at_most_kept_entries_stay(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cache, "KEPT", 2)
    for n in (11, 12, 13):
        load_config([f"study.n_trials={n}"])
    assert len(_entries(cache)) == 2
