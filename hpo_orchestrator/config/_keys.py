"""What an unknown configuration key probably meant, and the keys that imply a group.

"unknown configuration key 'scheduler.paralel'" with a hint to read conf/ left the user to
find the spelling; the hint now names the closest valid key (difflib over the keys of the
configuration as composed with the user's group choices), the group option a key belongs to
(``pruner.n_warmup_steps`` is ``pruner=median``'s), and ``run --show-config``, which prints
every key with its value.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

__all__ = ["IMPLYING_CUSTOM", "imply_groups", "unknown_key_hint"]

# objective=custom's own keys: given without an objective group, the user clearly means a
# custom objective (the default, lightgbm, has neither), so the group is implied.
IMPLYING_CUSTOM = ("objective.target", "objective.setup")


def imply_groups(overrides: list[str]) -> list[str]:
    """``overrides`` with ``objective=custom`` in front when they set ``objective.target`` (or
    ``setup``) and choose no objective."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    if "objective" not in keys and any(k in IMPLYING_CUSTOM for k in keys):
        return ["objective=custom", *overrides]
    return overrides


def unknown_key_hint(key: str, overrides: list[str], options: dict[str, list[str]],
                     compose: Any) -> str:
    """The hint for an unknown ``key``: the key the user typed (Hydra may name only its first
    part), its group option or its closest valid spelling, and ``run --show-config``.
    ``compose(overrides)`` returns the composed configuration as a dict; ``options`` the
    options of each group."""
    typed = next((k for k in (o.split("=", 1)[0].lstrip("+~") for o in overrides)
                  if k == key or k.startswith(key + ".")), key)
    show = "'hpo-orchestrator run --show-config' prints every key"
    groups = [o for o in overrides if o.split("=", 1)[0] in options]
    composed = compose(groups)
    known = _paths(composed)
    group = typed.split(".", 1)[0]
    if group in options and "." in typed:
        chosen = next((o.split("=", 1)[1] for o in reversed(groups) if o.startswith(group + "=")),
                      None)
        for option in options[group]:
            if option != chosen and typed in _paths(compose([*groups, f"{group}={option}"])):
                return f"{typed} is a key of {group}={option}: use {group}={option}; {show}"
    close = _closest(typed, composed, known)
    return f"did you mean {close!r}? {show}" if close else f"{show} (docs/CONFIGURATION.md)"


def _closest(typed: str, composed: dict[str, Any], known: list[str]) -> str | None:
    """Part by part, each unknown part replaced by its nearest sibling (``studdy.name`` ->
    ``study.name``, ``scheduler.paralel`` -> ``scheduler.parallel``); a lone name that is the
    last part of exactly one key becomes that key (``parallel`` -> ``scheduler.parallel``)."""
    section: Any = composed
    parts: list[str] = []
    for part in typed.split("."):
        if not isinstance(section, dict):
            break
        if part not in section:
            near = difflib.get_close_matches(part, [str(k) for k in section], n=1, cutoff=0.7)
            if not near:
                break
            part = near[0]
        parts.append(part)
        section = section[part]
    else:
        return ".".join(parts)
    last = typed.rsplit(".", 1)[-1]
    same = [k for k in known if k.rsplit(".", 1)[-1] == last]
    return same[0] if len(same) == 1 and "." not in typed else None


def _paths(section: Any, prefix: str = "") -> list[str]:
    return list(_walk(section, prefix))


def _walk(section: Any, prefix: str) -> Iterator[str]:
    if not isinstance(section, dict):
        return
    for key, value in section.items():
        path = f"{prefix}{key}"
        yield path
        yield from _walk(value, f"{path}.")
