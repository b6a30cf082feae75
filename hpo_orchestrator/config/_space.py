"""The built-in objectives' search spaces, and ``objective.search_space`` entries that change them.

As Hydra's Optuna sweeper keeps a study's ``params:`` in configuration, every parameter of a
built-in objective is an entry of ``objective.search_space`` with the fields of
:class:`SpaceEntry`, set one by one on the command line or as a mapping in YAML:

- ``low``, ``high`` (and ``log: true`` or ``step``): a range;
- ``choices: [A, B, ...]``: categorical, in place of the range;
- ``value: V``: fixed (the parameter is not searched), in place of both.

So ``objective.search_space.learning_rate.low=0.05``, ``objective.search_space.max_depth.value=6``
or ``objective.search_space.num_leaves.choices=[31,63,127]``. The parameter's kind (int or
float) is the objective's: ``low: 0, high: 1`` on a float parameter is the interval. Checked
once at load (ConfigError naming the entry); the objective reads the parsed :class:`ParamSpec`.
No Optuna import here: a trial's child unpickles its config from this package.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from hpo_orchestrator.errors import ConfigError

__all__ = ["LIGHTGBM_SPACE", "SPACES", "TORCH_MLP_SPACE", "ParamSpec", "SpaceEntry", "as_config",
           "check_entries", "check_params", "check_space", "resolve_space", "space_text"]


@dataclass
class SpaceEntry:
    """One parameter in ``objective.search_space`` (precedence: value, then choices, then range)."""

    low: Any = None
    high: Any = None
    log: bool = False
    step: Any = None
    choices: list[Any] | None = None
    value: Any = None


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as the objective suggests it. ``kind``: int or float (a range, or a fixed
    value when ``low == high``), or categorical (``choices``)."""

    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def fixed(self) -> bool:
        return self.kind != "categorical" and self.low == self.high


def _range(name: str, kind: str, low: float, high: float, log: bool = False) -> ParamSpec:
    return ParamSpec(name, kind, low, high, log)


# The defaults; every name here may be overridden, no other.
LIGHTGBM_SPACE: dict[str, ParamSpec] = {s.name: s for s in (
    _range("num_leaves", "int", 8, 256, log=True),
    _range("max_depth", "int", 3, 12),
    _range("learning_rate", "float", 0.01, 0.3, log=True),
    _range("min_child_samples", "int", 5, 100, log=True),
    _range("feature_fraction", "float", 0.4, 1.0),
    _range("bagging_fraction", "float", 0.4, 1.0),
    _range("lambda_l1", "float", 1e-8, 10.0, log=True),
    _range("lambda_l2", "float", 1e-8, 10.0, log=True),
)}
TORCH_MLP_SPACE: dict[str, ParamSpec] = {s.name: s for s in (
    _range("width", "int", 32, 512, log=True),
    _range("depth", "int", 1, 4),
    _range("dropout", "float", 0.0, 0.5),
    _range("lr", "float", 1e-4, 3e-2, log=True),
    _range("weight_decay", "float", 1e-6, 1e-2, log=True),
)}

SPACES = {"lightgbm": LIGHTGBM_SPACE, "torch_mlp": TORCH_MLP_SPACE}

_EXAMPLE = ("e.g. objective.search_space.learning_rate.low=0.02, "
            "objective.search_space.max_depth.choices=[4,6,8] or "
            "objective.search_space.max_depth.value=6 (fixed)")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fail(key: str, message: str, hint: str = _EXAMPLE) -> ConfigError:
    return ConfigError(f"{key}: {message}", hint)


def _cast(value: Any, kind: str, key: str) -> float | int:
    if not _number(value):
        raise _fail(key, f"expected a number, got {value!r}")
    if kind == "int":
        if float(value) != int(value):
            raise _fail(key, f"this parameter is an integer, got {value!r}")
        return int(value)
    return float(value)


def _parse(default: ParamSpec, entry: Any, key: str) -> ParamSpec:
    name, kind = default.name, default.kind
    if isinstance(entry, dict):  # YAML read without the schema (tests, hpo.config)
        unknown = sorted(set(entry) - {"low", "high", "log", "step", "choices", "value"})
        if unknown:
            raise _fail(key, f"unknown field {unknown[0]!r} (fields: low, high, log, step, "
                             "choices, value)")
        entry = SpaceEntry(**entry)
    if not isinstance(entry, SpaceEntry):
        raise _fail(key, f"expected fields low/high/log/step, choices or value, got {entry!r}")
    if entry.value is not None:
        value = _cast(entry.value, kind, f"{key}.value")
        # A fixed value keeps the default's log flag where it can: Optuna refuses a parameter
        # whose log setting changes within a study.
        return ParamSpec(name, kind, value, value, default.log and value > 0)
    if entry.choices is not None:
        if not isinstance(entry.choices, list) or not entry.choices:
            raise _fail(f"{key}.choices", f"expected a non-empty list, got {entry.choices!r}")
        return ParamSpec(name, "categorical",
                         choices=tuple(_cast(c, kind, f"{key}.choices") for c in entry.choices))
    if entry.low is None or entry.high is None:
        raise _fail(key, "a range needs both low and high")
    low, high = _cast(entry.low, kind, f"{key}.low"), _cast(entry.high, kind, f"{key}.high")
    if not isinstance(entry.log, bool):
        raise _fail(f"{key}.log", f"expected true or false, got {entry.log!r}")
    if low > high:
        raise _fail(key, f"low ({low}) > high ({high})")
    if entry.log and low <= 0:
        raise _fail(key, f"a log range needs low > 0, got {low}",
                    f"raise {key}.low, or set {key}.log=false")
    step = None
    if entry.step is not None:
        step = _cast(entry.step, kind, f"{key}.step")
        if step <= 0:  # said apart: a step of 0 was told about log, which it never set
            raise _fail(f"{key}.step", f"must be > 0, got {step}",
                        f"set {key}.step to a positive value, or {key}.step=null for none")
        if entry.log:
            raise _fail(key, "step cannot be combined with log: true",
                        f"set {key}.log=false to use a step")
    return ParamSpec(name, kind, low, high, entry.log, step)


def resolve_space(defaults: dict[str, ParamSpec], overrides: Any, path: str,
                  objective: str) -> dict[str, ParamSpec]:
    """The objective's space with ``objective.search_space`` applied; ConfigError on a bad entry."""
    key = f"{path}.search_space"
    if overrides is None:
        return dict(defaults)
    if not isinstance(overrides, dict):
        raise _fail(key, f"expected a mapping of parameter names, got {overrides!r}")
    space = dict(defaults)
    for name, entry in overrides.items():
        if name not in defaults:
            raise _fail(f"{key}.{name}", f"not a parameter of the {objective} objective",
                        f"its parameters: {', '.join(defaults)}")
        space[name] = _parse(defaults[name], entry, f"{key}.{name}")
    return space


def as_config(space: dict[str, ParamSpec]) -> dict[str, SpaceEntry]:
    """The default space as ``objective.search_space`` spells it (the dataclass default)."""
    return {name: SpaceEntry(spec.low, spec.high, spec.log) for name, spec in space.items()}


def check_space(defaults: dict[str, ParamSpec], overrides: Any, path: str, objective: str) -> None:
    resolve_space(defaults, overrides, path, objective)


def check_entries(entries: Any, where: str) -> None:
    """Each entry a non-empty mapping of param names to numbers, strings or booleans."""
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: expected a mapping of params or a list of them, got {entries!r}",
                          "e.g. {\"x\": 1.5, \"n\": 3}")
    for i, entry in enumerate(entries):
        label = f"{where}[{i}]" if len(entries) > 1 else where
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"{label}: expected a mapping of param names to values, got {entry!r}",
                              "e.g. {\"x\": 1.5, \"n\": 3}")
        for name, value in entry.items():
            ok = isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value))
            if not isinstance(name, str) or not ok:
                raise ConfigError(f"{label}: {name!r}: expected a number, string or boolean, "
                                  f"got {value!r}", "params are the values a trial suggests")


def check_params(entries: Any, objective: str | None, search_space: Any, where: str,
                 trials_space: dict[str, ParamSpec] | None = None) -> None:
    """Enqueued params (``study.enqueue``, ``hpo-orchestrator enqueue``): mappings of names to
    scalars, each name a parameter of the study's search space, of the right kind, within its
    range. The space: a built-in objective's (``objective.search_space`` applied); for any
    other, ``trials_space``, the distributions the study's trials used (None: none yet, so
    nothing to check against). Optuna takes any name and ignores one no trial suggests, and
    warns at the trial about a value outside the range: a typo would be silently lost."""
    if where == "study.enqueue" and entries == []:
        return
    check_entries(entries, where)
    defaults = SPACES.get(objective or "")
    if defaults is not None:
        space = resolve_space(defaults, search_space, "objective", objective or "")
        of, known = f"the {objective} objective", "its search space"
    elif trials_space:
        space, of, known = trials_space, "the study", "its search space (as its trials suggested it)"
    else:
        return
    extra = {"batch_size"} if objective == "torch_mlp" else set()
    for i, entry in enumerate(entries):
        label = f"{where}[{i}]" if len(entries) > 1 else where
        for name, value in entry.items():
            if name in extra:
                continue
            if name not in space:
                close = difflib.get_close_matches(name, list(space), n=1)
                guess = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{label}: {name!r} is not a parameter of {of}{guess}",
                                  f"{known}: {space_text(space)}")
            problem = _outside(space[name], value)
            if problem:
                raise ConfigError(f"{label}: {name}={value!r} {problem}",
                                  f"enqueue values within {known}: {space_text(space)}")


def space_text(space: dict[str, ParamSpec]) -> str:
    """A search space in one line: ``lr: float in [0.0001, 0.1] (log); n: int in [1, 8]``."""
    def one(spec: ParamSpec) -> str:
        if spec.kind == "categorical":
            return f"{spec.name}: one of {list(spec.choices)}"
        if spec.fixed:
            return f"{spec.name}: {spec.kind} fixed at {spec.low}"
        how = " (log)" if spec.log else f" (step {spec.step})" if spec.step else ""
        return f"{spec.name}: {spec.kind} in [{spec.low}, {spec.high}]{how}"
    return "; ".join(one(spec) for spec in space.values())


def _outside(spec: ParamSpec, value: Any) -> str | None:
    if spec.kind == "categorical":
        return None if value in spec.choices else f"is not one of {list(spec.choices)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is not a number ({spec.kind} parameter)"
    if spec.kind == "int" and float(value) != int(value):
        return "is not an integer"
    low, high = spec.low, spec.high
    assert low is not None and high is not None
    if not low <= value <= high:
        return f"is outside the range [{low}, {high}]"
    if spec.step:
        steps = (value - low) / spec.step
        if not math.isclose(steps, round(steps), abs_tol=1e-8):
            return f"is not on the grid of step {spec.step} from {low}"
    return None
