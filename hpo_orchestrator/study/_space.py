"""A custom objective's search space against the study's (docs/OBJECTIVES.md "Exit codes").

A built-in objective's space is configuration, compared with the study's record before the
run starts (study/_setup.py). A custom objective's is in its code: the first ``suggest_*`` of
each name in this run is compared with the distribution the study's earlier trials gave that
name. A range changed in the code mixed into the study silently; a kind changed (an int
become a categorical) failed trial after trial with Optuna's "Cannot set different
distribution kind", until the failure policy said "fix the objective and run the same
command again", five failed trials spent: the fix is a new ``study.name``. Now the call is
refused, its trial fails, and the run stops with exit 2 and that hint.

Define-by-run spaces whose range changes from trial to trial by design are left alone: a name
the study's trials suggested with more than one distribution is not checked.
"""

from __future__ import annotations

import inspect
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    json_to_distribution,
)

from hpo_orchestrator.db import rows

__all__ = ["StudySpace", "read_study_space"]

# Per name, the study's distinct distributions as the two ends of their range: equal when
# the name always had one (one scan of trial_params over the study, at the run's start).
_NAMES_SQL = (
    "SELECT p.param_name, MIN(p.distribution_json), MAX(p.distribution_json) FROM trial_params p "
    "JOIN trials t ON t.trial_id = p.trial_id WHERE t.study_id = :s GROUP BY p.param_name")

_SIGNATURES = {name: inspect.signature(getattr(optuna.Trial, name))
               for name in ("suggest_float", "suggest_int", "suggest_categorical",
                            "suggest_uniform", "suggest_loguniform", "suggest_discrete_uniform")}


def read_study_space(connection: Any, study_id: int) -> dict[str, BaseDistribution]:
    """{name: distribution} of the names the study's trials always suggested the same way."""
    return {str(name): json_to_distribution(low) for name, low, high in
            rows(connection, _NAMES_SQL, {"s": study_id}) if low == high}


def requested(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) \
        -> tuple[str, BaseDistribution] | None:
    """The (name, distribution) a suggest call asks for, as Optuna's Trial builds it; None for
    another call, or arguments Optuna itself will refuse (its error says what is wrong)."""
    signature = _SIGNATURES.get(method)
    if signature is None:
        return None
    try:
        bound = signature.bind(None, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if method == "suggest_categorical":
            return str(a["name"]), CategoricalDistribution(a["choices"])
        if method == "suggest_int":
            return str(a["name"]), IntDistribution(a["low"], a["high"], log=a["log"], step=a["step"])
        if method == "suggest_float":
            return str(a["name"]), FloatDistribution(a["low"], a["high"], log=a["log"],
                                                     step=a["step"])
        step = a.get("q")
        return str(a["name"]), FloatDistribution(a["low"], a["high"], step=step,
                                                 log=method == "suggest_loguniform")
    except Exception:  # Optuna's own call reports bad arguments
        return None


class StudySpace:
    """The study's space as its earlier trials suggested it; the first change this run meets."""

    def __init__(self, study_name: str, known: dict[str, BaseDistribution]) -> None:
        self.study_name = study_name
        self.known = known
        self.checked: set[str] = set()  # names this run already suggested as the study did
        self.changed: str | None = None  # the first change found: the run stops with it
        self.kind_changed = False  # ... of a kind Optuna refuses to mix (a range to choices)

    def check(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The error for a suggest that changes the study's space (None: it does not)."""
        asked = requested(method, args, kwargs)
        if asked is None or asked[0] in self.checked or asked[0] not in self.known:
            return None
        name, distribution = asked
        before = self.known[name]
        if distribution == before:
            self.checked.add(name)
            return None
        error = (f"the search space changed: {name} was {_shown(before)} in study "
                 f"{self.study_name!r}, this run suggests {_shown(distribution)}")
        if self.changed is None:
            self.changed = error
            self.kind_changed = type(distribution) is not type(before) \
                or getattr(distribution, "log", False) != getattr(before, "log", False)
        return error

    def hint(self) -> str:
        new = f"run the same command with a new study name (study.name={self.study_name}-2)"
        if self.kind_changed:  # Optuna refuses it within one study, allow_mixed or not
            return f"Optuna keeps one kind of distribution per name in a study: {new}"
        return (f"its trials would be mixed with the study's: {new}, or pass "
                "study.allow_mixed=true to add them anyway")


def _shown(distribution: BaseDistribution) -> str:
    """FloatDistribution(low=0.0, high=1.0, log=False, step=None), its defaults left out."""
    fields = {k: v for k, v in distribution._asdict().items()
              if not (k == "log" and v is False) and not (k == "step" and v in (None, 1))}
    return f"{type(distribution).__name__.removesuffix('Distribution').lower()}(" + \
        ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"
