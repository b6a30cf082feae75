"""Compose the run configuration with Hydra and turn every failure into one ConfigError."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo_orchestrator.config import _schema as schema
from hpo_orchestrator.config._cache import cached
from hpo_orchestrator.config._keys import imply_groups, unknown_key_hint
from hpo_orchestrator.config._search import PRUNERS, SAMPLERS
from hpo_orchestrator.errors import ConfigError

if TYPE_CHECKING:
    import yaml

# Hydra, OmegaConf and PyYAML are imported where a composition runs: a start whose
# composition is cached (config/_cache.py) needs none of them.

__all__ = ["config_dir", "load_config", "to_plain_dict"]

_GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "objective": {
        "lightgbm": schema.LightGBMObjectiveConfig,
        "torch_mlp": schema.TorchMLPObjectiveConfig,
        "custom": schema.CustomObjectiveConfig,
    },
    "pruner": PRUNERS,
    "sampler": SAMPLERS,
}

# Hydra's override grammar (ANTLR) rejects an unquoted value with these messages
_OVERRIDE_SYNTAX_ERRORS = ("Ambiguous value", "LexerNoViableAltException", "mismatched input",
                           "extraneous input", "no viable alternative", "token recognition error")


# The defaults ship inside the package, so a wheel installed anywhere finds them. In a
# checkout, hpo_orchestrator/conf is a link to the top-level conf/ (one copy of each YAML);
# the wheel build copies the files (docs/DESIGN.md §2.7).
_PACKAGED_CONF = Path(__file__).resolve().parents[1] / "conf"


def config_dir() -> Path:
    """The folder holding ``config.yaml``: $HPO_ORCHESTRATOR_CONF, else the packaged defaults.

    Folders of the user's own group options go on top with Hydra's
    ``hydra.searchpath=[file:///path]`` override, which keeps the packaged defaults.
    """
    override = os.environ.get("HPO_ORCHESTRATOR_CONF")
    # Hydra takes only an absolute folder; a relative one means from the current folder
    return Path(override).absolute() if override else _PACKAGED_CONF


def _register_schemas() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="base_config", node=schema.Config)
    for group, options in _GROUP_SCHEMAS.items():
        for option, node in options.items():
            store.store(group=group, name=f"base_{option}", node=node)
            # an option without a file of its own composes its dataclass's defaults (a pruner
            # is registered once: config/_search.py); a file, where there is one, shows them
            if not (config_dir() / group / f"{option}.yaml").is_file():
                store.store(group=group, name=option, node=node)


def _one_line(exc: BaseException) -> str:
    """The first meaningful line of an OmegaConf/Hydra message (they append context blocks)."""
    text = str(getattr(exc, "msg", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _explain(exc: BaseException, overrides: list[str]) -> ConfigError:
    from hydra.errors import MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    text = str(exc)
    if isinstance(exc, MissingConfigException) or "Could not find" in text:
        for group, options in _GROUP_SCHEMAS.items():
            if f"'{group}/" in text:
                chosen = next((o.split("=", 1)[1] for o in overrides
                               if o.split("=", 1)[0] == group), "?")
                return ConfigError(f"unknown {group} {chosen!r}",
                                   f"choose one of: {', '.join(options)}")
        return ConfigError(_one_line(exc), f"config folder: {config_dir()}")
    full_key = getattr(cause, "full_key", None)
    message = _one_line(cause)
    if "not in" in message or "Could not override" in text or "Key '" in message:
        key = full_key or message
        return ConfigError(f"unknown configuration key {key!r}", _unknown_key_hint(str(key), overrides))
    if full_key:
        # conf/ is the checkout's folder: a pip install has none; --show-config prints it all
        return ConfigError(f"{full_key}: {message}",
                           "check the value's type ('hpo-orchestrator run --show-config' "
                           "prints every key with its default)")
    if any(marker in message for marker in _OVERRIDE_SYNTAX_ERRORS):
        return ConfigError(message, "a value holding , # ' [ ] = or spaces goes in double quotes "
                                    "inside single ones, e.g. 'study.name=\"a, b\"'")
    return ConfigError(message, "overrides look like key=value, e.g. scheduler.parallel=4")


def _yaml_error(exc: yaml.YAMLError) -> ConfigError:
    """A config file that is not YAML: its name and line, from the parser's marks."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{mark.name}, line {mark.line + 1}" if mark is not None else str(config_dir())
    problem = getattr(exc, "problem", None) or _one_line(exc)
    return ConfigError(f"{where}: not valid YAML ({problem})",
                       "fix that line (a list is [a, b], a mapping is key: value)")


def _unknown_key_hint(key: str, overrides: list[str]) -> str:
    options = {group: list(choices) for group, choices in _GROUP_SCHEMAS.items()}
    hint = unknown_key_hint(key, overrides, options, _composed)
    if key.startswith("objective.search_space."):
        from hpo_orchestrator.config._space import LIGHTGBM_SPACE, TORCH_MLP_SPACE

        guess = hint.split("?", 1)[0] + "? " if hint.startswith("did you mean") else ""
        return (f"{guess}fields: low, high, log, step, choices, value; parameters: lightgbm "
                f"{', '.join(LIGHTGBM_SPACE)}; torch_mlp {', '.join(TORCH_MLP_SPACE)}")
    return hint


def _composed(overrides: list[str]) -> dict[str, Any]:
    """The configuration composed with ``overrides`` (group choices), unvalidated, as a dict;
    empty when even that fails (the hint then names no key)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            composed = compose(config_name="config", overrides=list(overrides))
        plain = OmegaConf.to_container(composed, resolve=False)
    except Exception:  # a hint is best effort: the error itself is already known
        return {}
    return plain if isinstance(plain, dict) else {}  # type: ignore[return-value]


def load_config(overrides: list[str]) -> schema.Config:
    """Compose ``conf/config.yaml`` with ``overrides`` and validate every value once
    (``objective.target`` without an objective group implies ``objective=custom``)."""
    overrides = imply_groups(list(overrides))
    conf = config_dir()
    if not (conf / "config.yaml").is_file():
        raise ConfigError(f"no config.yaml in {conf}", "set HPO_ORCHESTRATOR_CONF to a conf folder")
    return cached(overrides, conf, _compose).validate()


def _compose(overrides: list[str]) -> schema.Config:
    """Hydra's composition of the config folder with ``overrides``, typed by the schema."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _register_schemas()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            composed = compose(config_name="config", overrides=list(overrides))
        config = OmegaConf.to_object(composed)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc) from exc
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise _explain(exc, overrides) from exc
    assert isinstance(config, schema.Config)
    # `+key=value` may add keys that no schema declares; OmegaConf drops them silently.
    unknown = _extra_keys(OmegaConf.to_container(composed), to_plain_dict(config))
    if unknown:
        raise ConfigError(f"unknown configuration key {unknown[0]!r}",
                          _unknown_key_hint(unknown[0], overrides))
    _check_switches(overrides, composed)
    return config


# The words a switch takes (OmegaConf's own, any case); it also reads any number as a bool
# (2 as true), which hides a value meant for another key
_SWITCH_WORDS = {"true", "false", "yes", "no", "on", "off"}


def _check_switches(overrides: list[str], composed: Any) -> None:
    """A true/false key given anything but a word for one: one clear error, not a silent
    True (``scheduler.spare_workers=2`` is a typo, not a yes)."""
    from omegaconf import OmegaConf

    for override in overrides:
        key, sep, raw = override.lstrip("+").partition("=")
        if not sep or key.startswith("~") or "${" in raw:  # ${...}: the value of another key
            continue
        value = OmegaConf.select(composed, key, default=None)
        if isinstance(value, bool) and raw.strip().strip("'\"").lower() not in _SWITCH_WORDS:
            raise ConfigError(f"{key}: expected true or false, got {raw!r}",
                              f"{key}=true or {key}=false")


def _extra_keys(given: Any, known: Any, prefix: str = "") -> list[str]:
    if not isinstance(given, dict) or not isinstance(known, dict):
        return []
    extra: list[str] = []
    for key, value in given.items():
        path = f"{prefix}{key}"
        if key not in known:
            extra.append(path)
        else:
            extra.extend(_extra_keys(value, known[key], f"{path}."))
    return extra


def to_plain_dict(config: schema.Config) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (stored as the study attr ``hpo.config``):
    composition resolved every interpolation, so the dataclasses hold plain values."""
    plain = _plain(dataclasses.asdict(config))
    assert isinstance(plain, dict)
    return plain


def _plain(value: Any) -> Any:
    """Lists where the dataclasses hold tuples, as JSON and OmegaConf give them back."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


