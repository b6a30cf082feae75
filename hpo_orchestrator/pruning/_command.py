"""The ``run`` command ``tune-pruner`` recommends: one that runs as typed.

The study that was replayed is finished (its ``n_trials`` reached), and it was run with
settings the user gave on a command line we never saw. Printing only the pruner's overrides
made a command that ran the default objective into the finished study and did nothing, with
the default parallelism. So the command is rebuilt from the study's ``hpo.config``: every
setting that differs from the defaults of its objective and sampler (``scheduler.parallel``
always), the recommended pruner, and a new study name (one the storage does not hold), so the
two pruners' studies can be compared side by side with ``status``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any

from hpo_orchestrator.config import as_it_ran

__all__ = ["recommended_command"]

# Set per command, not copied: the name is new, the pruner is the recommendation, the budget
# is given as n_trials (add_trials is resolved against the old study's count), the storage is
# the one tune-pruner read (the recorded URL has its password masked).
_SKIP = {"study.name", "study.n_trials", "study.add_trials", "study.enqueue",
         "objective.name", "objective.target", "sampler.name", "scheduler.parallel", "storage.url"}
_PLAIN = re.compile(r"[\w./:@+\-]+", re.ASCII)  # Hydra reads other letters only quoted


def recommended_command(prog: str, study: str, recorded: dict[str, Any], pruner: str,
                        taken: set[str], storage: str | None = None,
                        folder: str | None = None) -> str:
    """``prog run ...`` for the recommended pruner (``pruner``: its overrides), from the
    replayed study's ``hpo.config`` (``recorded``; empty for a study run elsewhere);
    ``taken``: the study names already in the storage; ``storage``: its URL as the command
    gives it (without a password: db.connect.paste_url), None for the default; ``folder``: the
    study's run folder's name (scheduler.run_dir; the study's name where that is safe)."""
    name = _new_name(study, pruner, taken)
    # the replayed study's own artifact folder (the default, recorded resolved): the new
    # study gets its own
    store = (recorded.get("artifacts") or {}).get("store")
    own_store = isinstance(store, str) and \
        PurePath(store).parts[-2:] == (folder or study, "artifacts")
    overrides: list[str] = []
    objective = (recorded.get("objective") or {}).get("name")
    sampler = (recorded.get("sampler") or {}).get("name")
    if objective:
        overrides.append(f"objective={objective}")
    if objective == "custom":  # required, so the defaults below hold it too: give it here
        overrides.append(f"objective.target={_value(recorded['objective'].get('target'))}")
    if sampler:
        overrides.append(f"sampler={sampler}")
    defaults = _defaults(recorded)
    if defaults is not None:
        overrides += [f"{path}={_value(value)}" for path, value in _leaves(recorded)
                      if path not in _SKIP and not path.startswith("pruner.")
                      and not (path == "artifacts.store" and own_store)
                      and _at(defaults, path) != value]
    if storage is not None:
        overrides.append(f"storage.url={_value(storage)}")
    study_section = recorded.get("study") or {}
    n_trials = study_section.get("n_trials") or study_section.get("add_trials")
    if isinstance(n_trials, int):
        overrides.append(f"study.n_trials={n_trials}")
    parallel = (recorded.get("scheduler") or {}).get("parallel")
    if isinstance(parallel, int):
        overrides.append(f"scheduler.parallel={parallel}")
    overrides += [*pruner.split(), *_kept_pruner_options(recorded, pruner, defaults),
                  f"study.name={_value(name)}"]
    return " ".join([prog, "run", *map(shlex.quote, overrides)])


def _kept_pruner_options(recorded: dict[str, Any], pruner: str,
                         defaults: dict[str, Any] | None) -> list[str]:
    """The study's own pruner options that the recommendation does not set (the replay kept
    them: ``PrunerSetting.config``), where the recommended pruner is the one it ran and they
    differ from that pruner's defaults: ``pruner.patience_mode=delay``, say."""
    ran = as_it_ran(recorded.get("pruner") or {})
    given = dict(o.split("=", 1) for o in pruner.split())
    if defaults is None or given.get("pruner") != ran.get("name"):
        return []
    return [f"pruner.{key}={_value(value)}" for key, value in ran.items()
            if key != "name" and f"pruner.{key}" not in given
            and _at(defaults, f"pruner.{key}") != value]


def _new_name(study: str, pruner: str, taken: set[str]) -> str:
    tag = pruner.split()[0].removeprefix("pruner=").replace("_", "-")
    name = f"{study}-{tag}"
    serial = 2
    while name in taken:
        name, serial = f"{study}-{tag}-{serial}", serial + 1
    return name


def _defaults(recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved defaults for the recorded objective, sampler and pruner (None when they
    no longer load: then only the groups, the budget and the parallelism are given)."""
    from hpo_orchestrator.config import load_config, to_plain_dict

    groups = [f"{group}={section['name']}" for group in ("objective", "sampler", "pruner")
              if isinstance(section := recorded.get(group), dict) and section.get("name")]
    required = [f"objective.target={recorded['objective'].get('target')}"] \
        if (recorded.get("objective") or {}).get("name") == "custom" else []
    try:
        return to_plain_dict(load_config(groups + required))
    except Exception:  # a config of another release: keep what is certain
        return None


def _leaves(section: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in section.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def _at(section: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(section, dict) or key not in section:
            return _MISSING
        section = section[key]
    return section


_MISSING = object()


def _value(value: Any) -> str:
    """A Hydra override's value: null, true/false, numbers and simple strings as they are,
    lists as [a,b], other strings quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.fullmatch(text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
