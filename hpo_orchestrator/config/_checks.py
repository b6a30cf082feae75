"""The two checks every config dataclass uses: one ConfigError naming the key, with a hint."""

from __future__ import annotations

from typing import Any

from hpo_orchestrator.errors import ConfigError

__all__ = ["_positive_int", "_require"]


def _require(ok: bool, key: str, message: str, hint: str | None = None) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}", hint or
                          f"set {key}=... on the command line; 'hpo-orchestrator run "
                          f"--show-config' prints the resolved configuration")


def _positive_int(value: Any, key: str, minimum: int = 1) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             key, f"expected an integer >= {minimum}, got {value!r}")
