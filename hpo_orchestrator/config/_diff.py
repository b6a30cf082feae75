"""What changed between two configuration values, as short ``path: old -> new`` lines.

A study refuses a run whose objective differs from the one it recorded. Its search space is
a nested mapping (one entry per parameter, six fields each): shown whole, both spaces made a
line of about 2,000 characters in which the one changed bound had to be found by eye. So
mappings are compared key by key, down to the values that differ, and a name only one side
has is said to be added or removed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_SHOWN", "value_differences"]

MAX_SHOWN = 6  # differences named in one message; the rest are counted


def value_differences(path: str, old: Any, new: Any) -> list[str]:
    """``path: old -> new`` for each leaf that differs (``path.name: added`` / ``removed``
    for a mapping key one side lacks); nothing when equal."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in new:
                found.append(f"{path}.{key}: removed")
            elif key not in old:
                found.append(f"{path}.{key}: added")
            else:
                found += value_differences(f"{path}.{key}", old[key], new[key])
        return found
    return [f"{path}: {old!r} -> {new!r}"]
