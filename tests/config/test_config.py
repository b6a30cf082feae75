"""Configuration: composition, validation, and the bad-input contract (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo_orchestrator.config import config_dir, load_config
from hpo_orchestrator.errors import ConfigError
from tests.conftest import REPO


def test_defaults_compose() -> None:
    config = load_config([])
    assert config.objective.name == "lightgbm"
    assert config.pruner.name == "patient_hyperband"
    assert config.sampler.name == "tpe"
    assert config.storage.url == "sqlite:///hpo.db"


def test_the_default_pruner_is_one_setting_wherever_it_is_written() -> None:
    """The yaml (what a run gets), the config class (what the replay and sim_pruning build)
    and status's copy of its patience and min_resource agree."""
    from hpo_orchestrator.config import PatientHyperbandPrunerConfig
    from hpo_orchestrator.status import _findings
    pruner = load_config([]).pruner
    assert pruner == PatientHyperbandPrunerConfig()
    assert (pruner.patience, pruner.min_resource) == (_findings.DEFAULT_PATIENCE,
                                                      _findings.DEFAULT_MIN_RESOURCE)


def test_overrides_apply() -> None:
    config = load_config(["objective=torch_mlp", "scheduler.parallel=8", "pruner.patience=4",
                          "pruner.min_resource=3", "study.name=exp1", "scheduler.gpus=[0,1]",
                          "objective.batch_size=256"])
    assert (config.objective.name, config.objective.batch_size) == ("torch_mlp", 256)
    assert config.scheduler.parallel == 8 and config.scheduler.gpus == [0, 1]
    assert (config.pruner.patience, config.pruner.min_resource) == (4, 3)


def test_plain_hyperband_has_optunas_defaults() -> None:
    """pruner=hyperband is Optuna's HyperbandPruner with Optuna's own defaults (the pruner of
    the benchmark's optuna-hyperband baseline), with no patience to set."""
    pruner = load_config(["pruner=hyperband"]).pruner
    assert (pruner.name, pruner.min_resource, pruner.max_resource, pruner.reduction_factor) \
        == ("hyperband", 1, "auto", 3)
    assert not hasattr(pruner, "patience")


def test_packaged_defaults_are_the_top_level_conf() -> None:
    """One copy of each YAML: the package's conf/ is the checkout's conf/ (a link)."""
    assert config_dir().resolve() == (REPO / "conf").resolve()


def test_user_config_dir_on_top_adds_options_and_keeps_the_defaults(tmp_path: Path) -> None:
    """Hydra's convention: a folder of the user's own group options on the search path."""
    (tmp_path / "objective").mkdir()
    (tmp_path / "objective" / "mine.yaml").write_text(
        "defaults:\n  - base_custom\ntarget: mypkg.objective:objective\n")
    config = load_config([f"hydra.searchpath=[file://{tmp_path}]", "objective=mine"])
    assert config.objective.name == "custom" and config.objective.target == "mypkg.objective:objective"
    assert config.pruner.name == "patient_hyperband" and config.study.n_trials == 40


def test_conf_env_replaces_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config.yaml").write_text(
        (REPO / "conf" / "config.yaml").read_text().replace("n_trials: 40", "n_trials: 7"))
    for group in ("objective", "pruner", "sampler"):
        (tmp_path / group).symlink_to(REPO / "conf" / group)
    monkeypatch.setenv("HPO_ORCHESTRATOR_CONF", str(tmp_path))
    assert load_config([]).study.n_trials == 7


BAD = [
    (["scheduler.parallel=four"], "scheduler.parallel"),
    (["scheduler.parallel=0"], "scheduler.parallel"),
    # more than the host's memory holds processes: no slot list of 10^12 entries is made
    (["scheduler.parallel=999999999999"], "is more than this host can run at once: at most"),
    (["scheduler.trials_per_gpu=999999999999"], "scheduler.trials_per_gpu: 999999999999 is more"),
    (["scheduler.host_cores=999999999999"], "scheduler.host_cores: 999999999999 is more"),
    (["scheduler.cpu_slots=999999999999"], "scheduler.cpu_slots: 999999999999 is more"),
    (["scheduler.nope=1"], "unknown configuration key 'scheduler.nope'"),
    (["+extra=1"], "unknown configuration key 'extra'"),
    (["objective=nope"], "unknown objective 'nope'"),
    (["pruner=nope"], "unknown pruner 'nope'"),
    (["pruner.patience=-1"], "pruner.patience"),
    (["pruner.patience_mode=sometimes"], "pruner.patience_mode: expected veto, delay or reach"),
    (["pruner.min_resource=5", "pruner.max_resource=3"], "min_resource (5) > max_resource (3)"),
    (["pruner=median", "pruner.patience=3"], "unknown configuration key 'pruner.patience'"),
    (["pruner=hyperband", "pruner.patience=3"], "unknown configuration key 'pruner.patience'"),
    (["pruner=hyperband", "pruner.min_resource=auto"], "pruner.min_resource"),
    (["pruner=hyperband", "pruner.reduction_factor=1"], "pruner.reduction_factor"),
    (["pruner=hyperband", "pruner.min_resource=4", "pruner.max_resource=2"],
     "min_resource (4) > max_resource (2)"),
    (["objective=custom"], "objective.target"),
    (["objective=custom", "objective.target=nocolon"], "objective.target"),
    (["study.direction=sideways"], "study.direction"),
    (["scheduler.gpus=[-1]"], "scheduler.gpus"),
    (["scheduler.startup_overlap=maybe"], "scheduler.startup_overlap"),
    (["scheduler.first_level=ceil"], "scheduler.first_level"),
    (["objective=torch_mlp", "objective.prefetch_factor=2"], "prefetch_factor"),
    (["telemetry.interval_s=0"], "telemetry.interval_s"),
    (["not-an-override"], "not-an-override"),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD)
def test_bad_config_is_one_clear_error(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert expected in info.value.message
    assert "\n" not in info.value.message
    assert info.value.hint
