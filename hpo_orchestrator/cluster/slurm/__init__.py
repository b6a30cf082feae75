"""Slurm, the first cluster engine: the ``slurm`` config group and job arrays through
submitit."""

from __future__ import annotations

from hpo_orchestrator.cluster.slurm._array import SlurmEngine
from hpo_orchestrator.cluster.slurm._config import SlurmConfig, load_slurm_config

__all__ = ["SlurmConfig", "SlurmEngine", "load_slurm_config"]
