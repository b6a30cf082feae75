"""What a cluster engine is to ``hpo-orchestrator submit``: the seam between the study's side
of a submission (cluster/_submit.py: overrides checked, the payload, what is printed) and a
scheduler's (Slurm's: cluster/slurm/). A second engine (Kubernetes Jobs, say) is a folder
beside ``slurm/`` with a class of this protocol and a config group in ``conf/`` of its name,
listed in cluster/__init__.py's ``ENGINES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

__all__ = ["Engine", "Payload", "Plan", "Submitted"]

# What a job runs, made on the submitting machine from the run's overrides and the GPUs per
# node, then pickled and called with the job's index on its node.
Payload: TypeAlias = Callable[[list[str], int], Callable[[int], int]]


@dataclass(frozen=True)
class Plan:
    """One submission: ``nodes`` jobs, each one orchestrator running ``run_overrides`` on
    ``gpus_per_node`` GPUs; ``settings``: the engine's own config (its group's keys)."""

    run_overrides: list[str]
    nodes: int
    gpus_per_node: int
    folder: Path  # job scripts and logs, on a filesystem the nodes share
    settings: Any


@dataclass(frozen=True)
class Submitted:
    """What a submission says to the user: the job ids, how to watch the queue, stop the
    jobs, and where their logs are."""

    job_ids: list[str]
    queue: str
    stop: str
    logs: str


class Engine(Protocol):
    """A cluster scheduler that runs a study's orchestrators as jobs."""

    name: str  # its config group (conf/<name>/) and override prefix (<name>.key=value)
    title: str  # as messages name it

    def load(self, overrides: list[str]) -> Any:
        """Its config group's settings from the ``<name>=``/``<name>.*`` overrides, checked
        (bad input: ConfigError)."""

    def plan(self, settings: Any, run_overrides: list[str]) -> Plan:
        """The submission those settings make."""

    def dry_run(self, plan: Plan) -> str:
        """What a submission would send (a job script), without the scheduler."""

    def submit(self, payload: Callable[[int], int], plan: Plan) -> Submitted:
        """Submit ``plan.nodes`` jobs, each calling ``payload(index)`` on its node; all or
        none (a refusal is a ConfigError and leaves nothing queued)."""
