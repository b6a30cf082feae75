"""The default sampler (issue 26, deliverable 2): TPE with multivariate sampling and the
constant liar, chosen by the quality benchmark's sampler ablation (docs/QUALITY.md); both can
be turned off, and conditional parameters are sampled without a warning per trial."""

from __future__ import annotations

import logging
import warnings

import optuna
import pytest

from hpo_orchestrator.config import load_config
from hpo_orchestrator.study import build_sampler


def test_the_default_tpe_is_multivariate_with_the_constant_liar() -> None:
    sampler = build_sampler(load_config([]))
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert sampler._multivariate and sampler._constant_liar


def test_plain_tpe_is_one_override_away() -> None:
    sampler = build_sampler(load_config(["sampler.multivariate=false",
                                         "sampler.constant_liar=false"]))
    assert not sampler._multivariate and not sampler._constant_liar  # type: ignore[attr-defined]


def test_a_conditional_parameter_is_sampled_without_a_warning_per_trial(
        caplog: pytest.LogCaptureFixture) -> None:
    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        if x > 0.5:  # a parameter only some trials have
            return x + trial.suggest_float("y", 0.0, 1.0)
        return x

    with caplog.at_level(logging.WARNING, logger="optuna"), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated argument either
        study = optuna.create_study(sampler=build_sampler(load_config(
            ["sampler.n_startup_trials=2", "sampler.seed=1"])))
        study.optimize(objective, n_trials=8)
    assert not [r for r in caplog.records if "sampled independently" in r.getMessage()]
