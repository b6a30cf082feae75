"""The trial object a child's objective receives: Optuna's Trial API, answered remotely."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hpo_orchestrator.worker._link import Link
from hpo_orchestrator.worker._protocol import OBJECTIVE_ATTRS

__all__ = ["TrialProxy"]


class TrialProxy:
    """Forwards ``suggest_*``, ``report``, ``should_prune`` and ``set_user_attr`` to the
    orchestrator, which holds the real ``optuna.Trial`` and the study's warm cache.

    Only the orchestrator touches the storage: a child never pays the cost of loading the
    study, and sqlite sees a single writer.

    Thread safety: any thread may call it (each call is one exchange on the :class:`Link`);
    after the trial ends every call raises. Values cross the pipe as plain Python values
    (numbers, strings, lists, dicts): the orchestrator unpickles nothing else.
    """

    def __init__(self, link: Link, number: int) -> None:
        self._link = link
        self.number = number
        self.params: dict[str, Any] = {}
        self.user_attrs: dict[str, Any] = {}

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        status, payload = self._link.call(self.number, ("call", method, args, kwargs))
        if status == "err":
            raise payload
        return payload

    def _suggest(self, method: str, name: str, *args: Any, **kwargs: Any) -> Any:
        value = self._call(method, str(name), *args, **kwargs)
        self.params[name] = value
        return value

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._suggest("suggest_float", name, float(low), float(high),
                                   step=None if step is None else float(step), log=bool(log)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return int(self._suggest("suggest_int", name, int(low), int(high), step=int(step),
                                 log=bool(log)))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._suggest("suggest_categorical", name, [_plain(c) for c in choices])

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        return self.suggest_float(name, low, high, step=q)

    def report(self, value: float, step: int) -> None:
        self._call("report", float(value), int(step))

    def should_prune(self) -> bool:
        return bool(self._call("should_prune"))

    def set_user_attr(self, key: str, value: Any) -> None:
        """As Optuna's; the value must be JSON (Optuna stores it as JSON), and ``hpo.*`` keys
        belong to the orchestrator (docs/DESIGN.md §2.3)."""
        if not isinstance(key, str):
            raise TypeError(f"trial.set_user_attr: the key must be a str, not {type(key).__name__}")
        if key.startswith("hpo.") and key not in OBJECTIVE_ATTRS:
            raise ValueError(f"trial.set_user_attr({key!r}): the 'hpo.' attributes are the "
                             "orchestrator's; use another prefix (e.g. 'my.')")
        plain = json.loads(json.dumps(value))  # TypeError here, as Optuna would raise it
        self._call("set_user_attr", key, plain)
        self.user_attrs[key] = value

    def __repr__(self) -> str:
        return f"TrialProxy(number={self.number})"


def _plain(choice: Any) -> Any:
    """A numpy/torch scalar as its Python value (categorical choices are plain values)."""
    item = getattr(choice, "item", None)
    if callable(item) and not isinstance(choice, (str, bytes, int, float, bool)):
        try:
            return item()
        except (TypeError, ValueError):
            return choice
    return choice
