"""Small objectives for tests and demos; importable in child processes as
``hpo_orchestrator.testing.objectives:NAME``."""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

import optuna

from hpo_orchestrator.runtime import phase

__all__ = ["chaos", "curves", "pinned", "quadratic", "sleepy"]


def quadratic(trial: Any) -> float:
    x = trial.suggest_float("x", -2.0, 2.0)
    return (x - 0.5) ** 2


def pinned(trial: Any) -> float:
    """Records what this process was pinned to, and overlaps with other trials for a while."""
    trial.set_user_attr("test.cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES"))
    x = trial.suggest_float("x", -1.0, 1.0)
    with phase("train"):
        for step in range(1, 4):
            time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.3")))
            trial.report(x * x + 1.0 / step, step)
    return x * x


def curves(trial: Any) -> float:
    """Learning curves whose level is set by ``x``: bad trials are easy to prune."""
    x = trial.suggest_float("x", 0.0, 1.0)
    value = 0.0
    for step in range(1, 11):
        value = x + 1.0 / step
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
        time.sleep(0.02)
    return value


def sleepy(trial: Any) -> float:
    """Sleeps long enough to be interrupted."""
    trial.suggest_float("x", 0.0, 1.0)
    time.sleep(float(os.environ.get("HPO_TEST_SLEEP_S", "60")))
    return 0.0


def chaos(trial: Any) -> float:
    """Fails in a different way per trial number (a chaos study for the reliability tests)."""
    trial.suggest_float("x", 0.0, 1.0)
    mode = ("ok", "raise", "abort", "hang", "nan", "none", "memory", "sigkill")[trial.number % 8]
    if mode == "raise":
        raise RuntimeError("boom from the objective")
    if mode == "abort":
        os.abort()
    if mode == "hang":
        time.sleep(3600)
    if mode == "nan":
        return math.nan
    if mode == "none":
        return None  # type: ignore[return-value]
    if mode == "memory":
        raise MemoryError("could not allocate")
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0
