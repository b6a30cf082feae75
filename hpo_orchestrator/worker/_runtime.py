"""What an objective can learn about, and tell, the orchestrator from inside its process.

Usable from any objective (built-in or custom)::

    from hpo_orchestrator import phase, slot_info

    def objective(trial):
        with phase("data"):
            loader = make_loader(...)
        with phase("train"):
            ...

Outside an orchestrated child (plain Optuna, a notebook) both still work: ``phase`` does
nothing and ``slot_info`` describes the current process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hpo_orchestrator.worker._env import ChildEnv
from hpo_orchestrator.worker._link import Link

__all__ = ["SlotInfo", "artifact_store", "orchestrator_link", "phase", "phase_depth", "slot_info"]

# Set by the worker bootstrap; None outside an orchestrated child.
_connection: Link | None = None
_phase_stack: list[str] = []
_artifact_store: str | None = None  # the running trial's store folder (Job.artifact_store)


def _attach(connection: Link | None) -> None:
    global _connection
    _connection = connection


@dataclass(frozen=True)
class SlotInfo:
    """The slot this process was pinned to at spawn (read from its environment)."""

    slot: int | None
    gpu_index: int | None  # NVML index; None on a CPU slot
    gpu_uuid: str | None
    cuda_visible_devices: str | None
    num_threads: int
    attempt: int = 1  # 2 and up: a retry of a trial that ran out of memory, was killed or lost

    @property
    def on_gpu(self) -> bool:
        return self.gpu_index is not None


def slot_info() -> SlotInfo:
    env = ChildEnv.parse(os.environ)
    return SlotInfo(
        slot=env.slot,
        gpu_index=env.gpu_index,
        gpu_uuid=env.gpu_uuid,
        cuda_visible_devices=env.cuda_visible_devices,
        num_threads=env.num_threads or len(os.sched_getaffinity(0)),
        attempt=env.attempt,
    )


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark what the objective is doing, so telemetry is read per phase.

    A 0 % GPU reading during ``data`` is expected; during ``train`` it is a finding.
    """
    _phase_stack.append(str(name))  # a message carries plain values only
    if _connection is not None:
        _connection.send(("phase", _phase_stack[-1]))
    try:
        yield
    finally:
        _phase_stack.pop()
        if _connection is not None:
            _connection.send(("phase", _phase_stack[-1] if _phase_stack else None))


def orchestrator_link() -> Link | None:
    """This child's pipe to the orchestrator, None outside an orchestrated child: for the
    package's own calls beside the trial proxy's (``save_artifact``) and for the test fakes
    that misuse it on purpose."""
    return _connection


def artifact_store() -> str | None:
    """The running trial's artifact store folder (``Job.artifact_store``); None outside a
    trial, or when the run keeps no artifacts."""
    return _artifact_store


def phase_depth() -> int:
    """How many ``phase`` blocks are open: 0 between trials, which a reused worker must
    restore (a test objective checks it)."""
    return len(_phase_stack)
