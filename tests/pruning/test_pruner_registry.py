"""A pruner is registered once (config/_search.py, docs/DESIGN.md §3.2): a dataclass with its
``build`` and ``REPLAY``, named in ``PRUNERS``. This test adds one there, and nowhere else,
and sees ``run`` build it, ``tune-pruner`` replay its grid and recommend from it, and the
replay decide as Optuna's own pruner decides live."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import optuna
import pytest

from hpo_orchestrator.cli import main
from hpo_orchestrator.config import PRUNERS, Replay, Varied
from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.pruning import PrunerSetting, default_grid, load_curves, replay

pytestmark = pytest.mark.slow  # trials run in real child processes


def _warmups(full: int, given: Sequence[int] | None) -> Sequence[int]:
    return list(given or (1, 2))


@dataclass
class PercentilePrunerConfig:
    """Optuna's PercentilePruner: the whole of the registration (the module doc)."""

    REPLAY: ClassVar[Replay | None] = Replay("pct", (Varied("n_warmup_steps", "warmup", "w", 0, _warmups),))

    name: str = "percentile"
    percentile: float = 50.0
    n_startup_trials: int = 2
    n_warmup_steps: int = 1

    def validate(self, path: str) -> None:
        assert 0 < self.percentile < 100, path

    def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner:
        return optuna.pruners.PercentilePruner(self.percentile, n_startup_trials=self.n_startup_trials,
                                               n_warmup_steps=self.n_warmup_steps)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(PRUNERS, "percentile", PercentilePrunerConfig)  # the one place
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPO_ORCHESTRATOR_CONFIG_CACHE", "0")


def test_a_pruner_registered_once_is_run_tuned_and_replayed(
        registered: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "hpo.db"
    code = main(["run", "pruner=percentile", "pruner.n_warmup_steps=2", "objective=custom",
                 "objective.target=tests.objectives:curves", "study.n_trials=12",
                 "scheduler.parallel=1", "scheduler.gpus=none", "telemetry.enabled=false",
                 f"scheduler.lease_dir={tmp_path / 'leases'}", f"storage.url=sqlite:///{db}"])
    assert code == 0, capsys.readouterr().err
    with sqlite3.connect(db) as con:
        config = json.loads(con.execute("SELECT value_json FROM study_user_attributes "
                                        "WHERE key = 'hpo.config'").fetchone()[0])
        states = [s for (s,) in con.execute("SELECT state FROM trials ORDER BY number")]
    assert config["pruner"] == {"name": "percentile", "percentile": 50.0, "n_startup_trials": 2,
                                "n_warmup_steps": 2}
    assert "PRUNED" in states and "COMPLETE" in states  # its pruner judged the curves

    # the replay: the setting the study ran with (one trial at a time, so its pruner saw what
    # a replay in trial order sees) reproduces every decision of the run
    curves = load_curves(create_engine(f"sqlite:///{db}"), "hpo")
    as_run = PrunerSetting("percentile", n_warmup_steps=2)
    replayed = replay(curves, as_run, current=True)
    assert replayed.agreement == 1.0 and replayed.prune_rate > 0
    assert isinstance(as_run.build(), optuna.pruners.PercentilePruner)

    # tune-pruner: its grid holds the new pruner's settings, the one it ran with among them
    assert PrunerSetting("percentile", n_warmup_steps=1) in default_grid(curves.full_step)
    capsys.readouterr()
    assert main(["tune-pruner", "--json", "--storage", f"sqlite:///{db}"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    percentile = {r["setting"]: r for r in report["results"] if r["kind"] == "percentile"}
    assert set(percentile) == {"percentile(warmup=1)", "percentile(warmup=2)"}
    assert percentile["percentile(warmup=2)"]["current"]
    assert percentile["percentile(warmup=2)"]["overrides"] == "pruner=percentile pruner.n_warmup_steps=2"
