"""The trial object a child's objective receives: Optuna's Trial API, answered remotely."""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["TrialProxy"]


class TrialProxy:
    """Forwards ``suggest_*``, ``report``, ``should_prune`` and ``set_user_attr`` to the
    orchestrator, which holds the real ``optuna.Trial`` and the study's warm cache.

    Only the orchestrator touches the storage: a child never pays the cost of loading the
    study, and sqlite sees a single writer.
    """

    def __init__(self, connection: Connection, number: int) -> None:
        self._connection = connection
        self.number = number
        self.params: dict[str, Any] = {}
        self.user_attrs: dict[str, Any] = {}

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._connection.send(("call", method, args, kwargs))
        status, payload = self._connection.recv()
        if status == "err":
            raise payload
        return payload

    def _suggest(self, method: str, name: str, *args: Any, **kwargs: Any) -> Any:
        value = self._call(method, name, *args, **kwargs)
        self.params[name] = value
        return value

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._suggest("suggest_float", name, low, high, step=step, log=log))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return int(self._suggest("suggest_int", name, low, high, step=step, log=log))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._suggest("suggest_categorical", name, list(choices))

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
        self._call("set_user_attr", key, value)
        self.user_attrs[key] = value

    def __repr__(self) -> str:
        return f"TrialProxy(number={self.number})"

