"""Running a study on a cluster: ``hpo-orchestrator submit`` to Slurm through submitit."""

from __future__ import annotations

from hpo_orchestrator.cluster._config import SlurmConfig, load_slurm_config
from hpo_orchestrator.cluster._submit import Payload, submit

__all__ = ["Payload", "SlurmConfig", "load_slurm_config", "submit"]
