"""A package face whose names are imported from their modules on first use (PEP 562), shared by
db/, study/ and scheduler/: ``status --json`` on sqlite then never imports SQLAlchemy
(db/_sql.py), ``status`` reads the kept tally without importing Optuna, and a run starts its
first workers before it imports the orchestrator (scheduler/_first_wave.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, where: Mapping[str, str | tuple[str, str]],
                 namespace: MutableMapping[str, object]) -> Callable[[str], object]:
    """The package's ``__getattr__``: ``where`` maps a public name to its module (``"_x"``), or
    to its module and its name there (``("_x", "name")``); a name found is kept in
    ``namespace`` (the package's globals), so the next lookup is a plain one."""

    def __getattr__(name: str) -> object:
        found = where.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = (found, name) if isinstance(found, str) else found
        value = getattr(importlib.import_module(f"{package}.{module}"), attr)
        namespace[name] = value
        return value

    return __getattr__
