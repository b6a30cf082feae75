"""The trial object a child's objective receives: Optuna's Trial API, answered remotely."""

from __future__ import annotations

import datetime
import json
import warnings
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from hpo_orchestrator.worker._link import Link
from hpo_orchestrator.worker._protocol import OBJECTIVE_ATTRS
from hpo_orchestrator.worker._study_view import StudyView, not_available

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = ["TrialProxy"]


class TrialProxy:
    """Forwards ``suggest_*``, ``report``, ``should_prune`` and ``set_user_attr`` to the
    orchestrator, which holds the real ``optuna.Trial`` and the study's warm cache.

    Only the orchestrator touches the storage: a child never pays the cost of loading the
    study, and sqlite sees a single writer.

    The read side of Optuna's Trial is here too, so code written for Optuna (pruning
    callbacks, loggers) runs unchanged: ``number``, ``study`` (worker/_study_view.py),
    ``datetime_start`` (from the Job), ``params``/``distributions`` (kept as ``suggest_*``
    calls return), ``user_attrs`` (those this objective set), ``relative_params`` (asked of
    the orchestrator: it costs a sampler call). What needs the study's storage raises
    :class:`NotInTrialProcess` naming the limitation.

    Thread safety: any thread may call it (each call is one exchange on the :class:`Link`);
    after the trial ends every call raises. Values cross the pipe as plain Python values
    (numbers, strings, lists, dicts): the orchestrator unpickles nothing else.
    """

    def __init__(self, link: Link, number: int, *, study_name: str = "",
                 directions: tuple[str, ...] = ("minimize",),
                 datetime_start: datetime.datetime | None = None) -> None:
        self._link = link
        self.number = number
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, BaseDistribution] = {}
        self.user_attrs: dict[str, Any] = {}
        self.datetime_start = datetime_start
        self.study = StudyView(study_name, directions, self._read)
        self._relative_params: dict[str, Any] | None = None

    @property
    def relative_params(self) -> dict[str, Any]:
        """The sampler's relative (joint) sample for this trial, as Optuna's: computed once by
        the orchestrator's trial (its first suggest computes it anyway)."""
        if self._relative_params is None:
            self._relative_params = dict(self._read("relative_params"))
        return dict(self._relative_params)

    def _read(self, what: str) -> Any:
        return self._call(what)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        status, payload = self._link.call(self.number, ("call", method, args, kwargs))
        if status == "err":
            raise payload
        return payload

    def _suggest(self, method: str, name: str, distribution: Callable[[], BaseDistribution],
                 *args: Any, **kwargs: Any) -> Any:
        value = self._call(method, str(name), *args, **kwargs)
        self.params[name] = value
        # The orchestrator's trial accepted these arguments, so the same distribution builds
        # here (Optuna's own adjustment of ``high`` to the step included).
        self.distributions[name] = distribution()
        return value

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        from optuna.distributions import FloatDistribution

        args = (float(low), float(high), None if step is None else float(step), bool(log))
        with warnings.catch_warnings():  # the orchestrator's trial warned already
            warnings.simplefilter("ignore")
            return float(self._suggest(
                "suggest_float", name,
                lambda: FloatDistribution(args[0], args[1], log=args[3], step=args[2]),
                args[0], args[1], step=args[2], log=args[3]))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        from optuna.distributions import IntDistribution

        args = (int(low), int(high), int(step), bool(log))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return int(self._suggest(
                "suggest_int", name,
                lambda: IntDistribution(args[0], args[1], log=args[3], step=args[2]),
                args[0], args[1], step=args[2], log=args[3]))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        from optuna.distributions import CategoricalDistribution

        plain = [_plain(c) for c in choices]
        return self._suggest("suggest_categorical", name,
                             lambda: CategoricalDistribution(plain), plain)

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

    def __getattr__(self, name: str) -> Any:
        """Only for names not found: a member of Optuna's Trial that needs the storage
        (``storage``, ``set_constraint``...) says why it is missing; a typo stays a typo."""
        if name in _trial_members():
            raise not_available("trial", name)
        raise AttributeError(f"'TrialProxy' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"TrialProxy(number={self.number})"


@cache
def _trial_members() -> frozenset[str]:
    """Members of Optuna's Trial that need the storage (imported here, not with the module:
    see worker/_study_view.py)."""
    import optuna

    return frozenset(n for n in dir(optuna.Trial) if not n.startswith("__")) | {
        "storage", "_trial_id", "_study_id", "_cached_frozen_trial", "system_attrs",
        "set_system_attr"}


def _plain(choice: Any) -> Any:
    """A numpy/torch scalar as its Python value (categorical choices are plain values)."""
    item = getattr(choice, "item", None)
    if callable(item) and not isinstance(choice, (str, bytes, int, float, bool)):
        try:
            return item()
        except (TypeError, ValueError):
            return choice
    return choice
