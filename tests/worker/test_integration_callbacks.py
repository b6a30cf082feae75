"""Optuna code runs unchanged in an orchestrated trial (issue 30, item 1): optuna-integration's
real ``LightGBMPruningCallback`` (it checks ``trial.study.direction`` against the metric's,
then reports and asks whether to prune) and a PyTorch Lightning-style pruning callback (what
``PyTorchLightningPruningCallback.on_validation_end`` does with the trial, without lightning),
each in a custom objective through a real run. The stand-in's reads one by one:
tests/worker/test_trial_reads.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_cli, trial_rows

OBJECTIVES = '''
import lightgbm as lgb
import numpy as np
import optuna
from optuna_integration import LightGBMPruningCallback


def _data(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(240, 4))
    y = x[:, 0] - 0.5 * x[:, 1] + 0.1 * rng.normal(size=240)
    return x, y


def _seen(trial):
    return {"study_name": trial.study.study_name, "direction": trial.study.direction.name,
            "number": trial.number, "params": trial.params,
            "distributions": {k: type(d).__name__ for k, d in trial.distributions.items()},
            "started": trial.datetime_start.isoformat(), "study_user_attrs": trial.study.user_attrs,
            "relative_params": trial.relative_params}


def lightgbm_objective(trial):
    x, y = _data(trial.number)
    train = lgb.Dataset(x[:160], y[:160])
    valid = lgb.Dataset(x[160:], y[160:], reference=train)
    params = {"objective": "regression", "metric": "l2", "verbosity": -1, "num_threads": 1,
              "num_leaves": trial.suggest_int("num_leaves", 2, 16),
              "learning_rate": trial.suggest_float("learning_rate", 0.05, 0.3, log=True)}
    booster = lgb.train(params, train, num_boost_round=8, valid_sets=[valid],
                        callbacks=[LightGBMPruningCallback(trial, "l2")])
    trial.set_user_attr("seen", _seen(trial))
    return float(booster.best_score["valid_0"]["l2"])


def wrong_direction_objective(trial):
    """auc is higher-is-better; the study minimizes: the callback's own check refuses it."""
    x, y = _data(0)
    train = lgb.Dataset(x[:160], (y[:160] > 0).astype(int))
    valid = lgb.Dataset(x[160:], (y[160:] > 0).astype(int), reference=train)
    lgb.train({"objective": "binary", "metric": "auc", "verbosity": -1, "num_threads": 1},
              train, num_boost_round=2, valid_sets=[valid],
              callbacks=[LightGBMPruningCallback(trial, "auc")])
    return 0.0


class LightningStylePruning:
    """PyTorchLightningPruningCallback's use of the trial: report the monitored metric at the
    end of each validation epoch, raise TrialPruned when told; the metric's sign follows
    trial.study.direction (as its LightGBM sibling checks it)."""

    def __init__(self, trial, monitor):
        self._trial = trial
        self.monitor = monitor
        self._sign = 1.0 if trial.study.direction == optuna.study.StudyDirection.MINIMIZE else -1.0

    def on_validation_end(self, epoch, callback_metrics):
        current_score = callback_metrics.get(self.monitor)
        self._trial.report(self._sign * current_score, step=epoch)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"Trial was pruned at epoch {epoch}.")


def lightning_objective(trial):
    lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
    pruning = LightningStylePruning(trial, "val_loss")
    loss = 1.0
    for epoch in range(6):
        loss = abs(lr - 0.1) + 1.0 / (epoch + 1)
        pruning.on_validation_end(epoch, {"val_loss": loss})
    trial.set_user_attr("seen", _seen(trial))
    return loss
'''


def _curves(db: Path, study: str) -> dict[int, int]:
    """trial number -> how many intermediate values it reported."""
    with sqlite3.connect(db) as con:
        return dict(con.execute(
            "SELECT t.number, COUNT(v.trial_intermediate_value_id) FROM trials t "
            "JOIN studies s ON s.study_id = t.study_id LEFT JOIN trial_intermediate_values v "
            "ON v.trial_id = t.trial_id WHERE s.study_name = ? GROUP BY t.number", (study,)))


@pytest.mark.slow
def test_optuna_integration_and_lightning_style_callbacks_run_unchanged(tmp_path: Path) -> None:
    (tmp_path / "cbs").mkdir()
    (tmp_path / "cbs" / "__init__.py").write_text("")
    (tmp_path / "cbs" / "objectives.py").write_text(OBJECTIVES)
    for study, target, pruner in [("lgb", "lightgbm_objective", "pruner=median"),
                                  ("lightning", "lightning_objective", "pruner=none")]:
        ran = run_cli(tmp_path, "run", "objective=custom", f"objective.target=cbs.objectives:{target}",
                      f"study.name={study}", "study.n_trials=4", "scheduler.parallel=2", pruner)
        assert ran.code == 0, ran.stderr
        rows = trial_rows(ran.db, study)
        assert len(rows) == 4 and {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}
        steps = 8 if study == "lgb" else 6
        curves = _curves(ran.db, study)
        for row in rows:
            if row["state"] == "COMPLETE":
                assert curves[row["number"]] == steps  # every report reached the study
                seen = row["attrs"]["seen"]
                assert seen["study_name"] == study and seen["direction"] == "MINIMIZE"
                assert seen["number"] == row["number"] and seen["relative_params"] == {}
                assert seen["started"].replace("T", " ") == row["start"]
                assert set(seen["params"]) == set(seen["distributions"])
                assert isinstance(seen["study_user_attrs"], dict)
    wrong = run_cli(tmp_path, "run", "objective=custom",
                    "objective.target=cbs.objectives:wrong_direction_objective", "study.name=wrong",
                    "study.n_trials=1", "pruner=none")
    failed = trial_rows(wrong.db, "wrong")
    assert failed[0]["state"] == "FAIL", wrong.stderr
    assert "inconsistent with the objective values in terms of study directions" in \
        failed[0]["attrs"]["hpo.error"]
