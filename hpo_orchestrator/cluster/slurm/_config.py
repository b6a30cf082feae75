"""The ``slurm`` config group: how ``hpo-orchestrator submit`` asks Slurm for jobs.

Kept apart from the run configuration: the run's own keys are validated by the same loader as
``hpo-orchestrator run`` (the job runs exactly that), these only shape the sbatch script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpo_orchestrator.config import config_dir
from hpo_orchestrator.errors import ConfigError

__all__ = ["CPUS_PER_GPU", "SlurmConfig", "load_slurm_config"]

# CPU cores asked per GPU when slurm.cpus_per_task is unset: a trial's data loading and the
# orchestrator need cores beside each GPU (4 for a whole 8-GPU node left 7 of 8 trials a
# half-core each).
CPUS_PER_GPU = 4

# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_HINT = "see conf/slurm/default.yaml for the slurm.* keys and their defaults"


@dataclass
class SlurmConfig:
    partition: str | None = None
    account: str | None = None
    time: str = "01:00:00"
    nodes: int = 1
    gpus_per_node: int = 1
    cpus_per_task: int | None = None  # None: CPUS_PER_GPU per GPU (cpus())
    mem: str | None = None
    job_name: str = "hpo"
    folder: str = "slurm-jobs"
    extra: list[str] = field(default_factory=list)

    def validate(self) -> SlurmConfig:
        for key, minimum in (("nodes", 1), ("gpus_per_node", 0), ("cpus_per_task", 1)):
            value = getattr(self, key)
            if value is not None and value < minimum:
                raise ConfigError(f"slurm.{key}: expected an integer >= {minimum}, got {value}", _HINT)
        if not _TIME.match(self.time):
            raise ConfigError(f"slurm.time: expected minutes or [D-]HH:MM:SS, got {self.time!r}",
                              "e.g. slurm.time=04:00:00")
        if self.mem is not None and not re.match(r"^\d+[KMGT]?$", self.mem):
            raise ConfigError(f"slurm.mem: expected a size such as 32G, got {self.mem!r}", _HINT)
        for line in self.extra:
            if not line.startswith("--") or len(line) < 3:
                raise ConfigError(f"slurm.extra: expected sbatch options such as '--qos=high', "
                                  f"got {line!r}", "e.g. slurm.extra='[--qos=high,--exclusive]'")
        return self

    def cpus(self) -> int:
        """``--cpus-per-task``: as set, or CPUS_PER_GPU per GPU of the node (a CPU job: 4)."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return CPUS_PER_GPU * max(1, self.gpus_per_node)

    def minutes(self) -> int:
        """``time`` in whole minutes (submitit counts its requeues against it)."""
        days, _, clock = self.time.rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        if days:  # D-HH, D-HH:MM, D-HH:MM:SS
            hours, mins, secs = ([*parts, 0, 0])[:3]
        else:  # MM, MM:SS, HH:MM:SS
            hours, mins, secs = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
        total = (int(days or 0) * 24 + hours) * 60 + mins + (1 if secs else 0)
        return max(1, total)

    def sbatch_options(self) -> dict[str, Any]:
        """``slurm.extra`` as submitit's additional_parameters (``--key=value``, ``--flag``)."""
        options: dict[str, Any] = {}
        for line in self.extra:
            key, sep, value = line[2:].partition("=")
            options[key.replace("-", "_")] = value if sep else True
        return options


def load_slurm_config(overrides: list[str]) -> SlurmConfig:
    """conf/slurm/<option>.yaml (default: default.yaml) with ``slurm.*`` overrides, checked
    against :class:`SlurmConfig`: unknown keys and wrong types are ConfigErrors."""
    option = "default"
    dotlist = []
    raw: dict[str, str] = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            raise ConfigError(f"{override!r}: expected key=value", "e.g. slurm.nodes=2")
        if key == "slurm":
            option = value
        elif key == "slurm.time":
            raw["time"] = value  # YAML would read 2:00:00 as a base-60 integer (7200)
        else:
            dotlist.append(f"{key.removeprefix('slurm.')}={value}")
    path = config_dir() / "slurm" / f"{option}.yaml"
    if not path.is_file():
        choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"unknown slurm {option!r}", f"choose one of: {', '.join(choices) or 'none'}")
    try:
        node = OmegaConf.merge(OmegaConf.structured(SlurmConfig), OmegaConf.load(path),
                               OmegaConf.from_dotlist(dotlist), OmegaConf.create(raw))
        config = OmegaConf.to_object(node)
    except OmegaConfBaseException as exc:
        full_key = getattr(exc, "full_key", None)
        first = str(exc).strip().splitlines()[0]
        if "not in" in first or "Key '" in first:
            raise ConfigError(f"unknown configuration key 'slurm.{full_key or first}'", _HINT) from None
        raise ConfigError(f"slurm.{full_key}: {first}" if full_key else first, _HINT) from None
    assert isinstance(config, SlurmConfig)
    return config.validate()
