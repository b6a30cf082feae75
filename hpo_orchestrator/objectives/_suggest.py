"""Suggest a built-in objective's parameters from its resolved search space (config/_space.py)."""

from __future__ import annotations

from typing import Any

from hpo_orchestrator.config import ParamSpec

__all__ = ["suggest", "suggest_all"]


def suggest(trial: Any, spec: ParamSpec) -> Any:
    """One parameter. A fixed value is still suggested (a one-point range of the same kind and
    log flag), so it is recorded with the trial and stays compatible with the study's other
    trials of that parameter."""
    if spec.kind == "categorical":
        return trial.suggest_categorical(spec.name, list(spec.choices))
    if spec.kind == "int":
        return trial.suggest_int(spec.name, int(spec.low), int(spec.high),  # type: ignore[arg-type]
                                 step=int(spec.step or 1), log=spec.log)
    return trial.suggest_float(spec.name, float(spec.low), float(spec.high),  # type: ignore[arg-type]
                               step=None if spec.step is None else float(spec.step), log=spec.log)


def suggest_all(trial: Any, space: dict[str, ParamSpec]) -> dict[str, Any]:
    """Every parameter of ``space``, in its order."""
    return {name: suggest(trial, spec) for name, spec in space.items()}
