"""The shapes of our study attrs (``hpo.config``, ``hpo.devices.<host>``, ``hpo.packing.<host>``,
``hpo.device_choice.<host>``, ``hpo.pruner.min_resource_auto``, ``hpo.pruner_history``,
``hpo.pruner_tuning``) as status and report read them.

Anyone who can write the database can write these attrs (``optuna study set-user-attr``, another
host, a shared .db file): one of a shape we never write is set aside as unreadable, and status
and report name it, instead of failing on it halfway through a page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpo_orchestrator import keys

__all__ = ["well_formed"]

_SECTIONS = ("study", "scheduler", "objective", "pruner", "sampler", "storage", "telemetry")
_CHANGE_KEYS = ("time", "gpu", "from", "to", "reason")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dicts(value: Any, keys: tuple[str, ...] = (), ints: tuple[str, ...] = ()) -> bool:
    """A list of dicts, each with ``keys``, and the ``ints`` among them whole numbers."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and all(k in item for k in keys)
        and all(_is_int(item[k]) for k in ints) for item in value)


def _config(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value[s], dict) for s in _SECTIONS if value.get(s) is not None)


def _devices(value: Any) -> bool:
    return value is None or _dicts(value, ("index",), ("index",))


def _packing(value: Any) -> bool:
    return (isinstance(value, dict)
            and isinstance(value.get("mps") or {}, dict)
            and _dicts(value.get("levels") or [], ("gpu", "limit"), ("gpu",))
            and _dicts(value.get("changes") or [], _CHANGE_KEYS, ("gpu",)))


def _min_resource_auto(value: Any) -> bool:
    return (isinstance(value, dict)
            and all(value.get(k) is None or _is_int(value[k]) for k in ("min_resource", "at_trial"))
            and isinstance(value.get("reason", ""), str))


def _setting(value: Any) -> bool:
    return isinstance(value, dict) and all(
        value.get(k) is None or _is_int(value[k]) for k in ("patience", "min_resource", "reduction_factor"))


def _pruner_history(value: Any) -> bool:
    return _dicts(value, ("time", "old", "new", "evidence")) and all(
        _setting(e["old"]) and _setting(e["new"]) and isinstance(e["evidence"], dict)
        and isinstance(e.get("reason", ""), str) for e in value)


def _pruner_tuning(value: Any) -> bool:
    return (isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("decision", "reason"))
            and _setting(value.get("setting") or {}))


def _device_choice(value: Any) -> bool:
    learners = value.get("learners", {}) if isinstance(value, dict) else None
    return (isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("learner", "reason"))
            and _learner_counts(learners))


def _learner_counts(value: Any) -> bool:
    """``{"<gpu index>": {"<learner>": count}}``."""
    return isinstance(value, dict) and all(
        isinstance(counts, dict) and all(isinstance(n, str) and _is_int(c) for n, c in counts.items())
        for counts in value.values())


_SHAPES: list[tuple[str, Callable[[Any], bool]]] = [
    (keys.CONFIG, _config), (keys.DEVICES_PREFIX, _devices), (keys.PACKING_PREFIX, _packing),
    (keys.DEVICE_CHOICE_PREFIX, _device_choice),
    (keys.PRUNER_MIN_RESOURCE_AUTO, _min_resource_auto),
    (keys.PRUNER_HISTORY, _pruner_history), (keys.PRUNER_TUNING, _pruner_tuning)]


def well_formed(key: str, value: Any) -> bool:
    """Whether ``value`` has the shape we write under ``key`` (a key of no known shape: yes)."""
    for prefix, check in _SHAPES:
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return check(value)
    return True
