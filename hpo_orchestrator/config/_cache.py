"""The composed configuration of a run, kept between runs so that a start need not import Hydra.

Importing Hydra and composing ``conf/`` takes about 0.5 s on the 2-core VM, a third of plain
Optuna's whole launch-to-first-trial time (docs/BENCHMARKS.md "Start-up"), and every run
with the same inputs composes the same thing. So the composed, not yet validated
:class:`~hpo_orchestrator.config.Config` is pickled under the user's cache folder, keyed by
everything composition reads: the overrides, every file of the config folder, the source of
this package's configuration schema, and where Hydra and OmegaConf are installed (their
files' modification times). Validation (files the config names, the search space) runs on
every start, on the cached copy as on a fresh one.

Left to Hydra every time: overrides of ``hydra.*`` (a search path adds folders the key would
not cover) and interpolations (``${oc.env:X}`` reads the environment), in the overrides or in
a config file. A failed composition is never cached, so its error is Hydra's, as before. The
cache is only an accelerator: a folder that cannot be written or a file that cannot be read
means composing as if it were empty, and ``HPO_ORCHESTRATOR_CONFIG_CACHE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

from hpo_orchestrator.config import _schema as schema

__all__ = ["cache_folder", "cached"]

FORMAT = 1  # bump when what is pickled changes shape beyond the schema's source
KEPT = 32  # entries kept: the newest, by modification time
_SCHEMA_SOURCES = Path(__file__).resolve().parent


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/hpo-orchestrator/config`` (``~/.cache`` where unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpo-orchestrator" / "config"


def cached(overrides: list[str], conf: Path,
           compose: Callable[[list[str]], schema.Config]) -> schema.Config:
    """``compose(overrides)``, or the same result kept from an earlier run with the same
    inputs. The caller validates what it gets."""
    key = _key(overrides, conf)
    if key is None:
        return compose(overrides)
    path = cache_folder() / f"{key}.pickle"
    config = _read(path)
    if config is None:
        config = compose(overrides)
        _write(path, config)
    return config


def _key(overrides: list[str], conf: Path) -> str | None:
    """A digest of every input of the composition, or None where it cannot be cached."""
    if os.environ.get("HPO_ORCHESTRATOR_CONFIG_CACHE", "1") == "0":
        return None
    if any("${" in o or o.lstrip("+~").startswith("hydra.") for o in overrides):
        return None
    digest = hashlib.sha256(f"{FORMAT}\0{sys.version}\0{conf}\0".encode())
    digest.update("\0".join(overrides).encode())
    try:
        for file in sorted(p for p in conf.rglob("*") if p.is_file()):
            text = file.read_bytes()
            if b"${" in text:
                return None
            digest.update(f"\0{file.relative_to(conf)}\0".encode() + text)
        for source in sorted(_SCHEMA_SOURCES.glob("*.py")):
            digest.update(source.read_bytes())
        for package in ("hydra", "omegaconf"):
            spec = importlib.util.find_spec(package)
            origin = spec.origin if spec is not None else None
            digest.update(f"\0{origin}\0{os.stat(origin).st_mtime_ns if origin else ''}".encode())
    except (OSError, ValueError):
        return None
    return digest.hexdigest()[:32]


def _read(path: Path) -> schema.Config | None:
    try:
        with path.open("rb") as file:
            # Only a file of this user's: the folder is theirs, made private below.
            if os.fstat(file.fileno()).st_uid != os.getuid():
                return None
            config = pickle.load(file)
    except Exception:  # missing, truncated, or pickled by other code: compose instead
        return None
    if not isinstance(config, schema.Config):
        return None
    os.utime(path)  # recently used: kept by the pruning in _write
    return config


def _write(path: Path, config: schema.Config) -> None:
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial.write_bytes(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(path)  # a reader never sees half a file
        entries = sorted(path.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-KEPT]:
            old.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
