"""Running a study on a cluster: ``hpo-orchestrator submit`` through a cluster engine
(cluster/_engine.py); Slurm (through submitit) is the first."""

from __future__ import annotations

from rich.console import Console

from hpo_orchestrator.cluster._engine import Engine, Payload, Plan, Submitted
from hpo_orchestrator.cluster._submit import submit as _submit
from hpo_orchestrator.cluster.slurm import SlurmConfig, SlurmEngine, load_slurm_config

__all__ = ["ENGINES", "Engine", "Payload", "Plan", "SlurmConfig", "Submitted", "load_slurm_config",
           "submit"]

# The engines ``submit`` knows, the default first: a new one is a folder beside slurm/ and a
# config group of its name in conf/.
ENGINES: list[Engine] = [SlurmEngine()]


def submit(overrides: list[str], dry_run: bool, console: Console, payload: Payload) -> int:
    """Submit the study with the engine its overrides name (cluster/_submit.py)."""
    return _submit(overrides, dry_run, console, payload, ENGINES)
