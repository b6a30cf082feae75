"""The orchestrator's model of its work: worker processes, trials on slots, finished trials.

Owned by the orchestrator's loop (single-threaded): nothing here is shared with the
telemetry thread, which only sees slot ids and pids.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, Protocol

import optuna
from optuna.trial import TrialState

from hpo_orchestrator.scheduler._slots import Slot
from hpo_orchestrator.worker import TrialOutcome

__all__ = ["Asked", "FinishedTrial", "Reporter", "RunningTrial", "Worker"]


@dataclass
class Worker:
    """A child process of one slot. Fresh mode: one trial. Reuse mode: many, one at a time."""

    process: subprocess.Popen[bytes]
    connection: Connection
    log: IO[bytes]
    cuda_visible_devices: str
    trials: int = 0  # trials started in it so far


@dataclass
class RunningTrial:
    """A trial on a slot, from its spawn until its result is recorded."""

    trial: optuna.Trial
    slot: Slot
    worker: Worker  # the process running it (in reuse mode it outlives the trial)
    attempt: int  # 1, or 2 and up for a retry
    spawned_at: float  # monotonic
    spawned_epoch: float
    oom_kills_at_spawn: int | None
    started_at: float | None = None
    phase: str | None = None
    last_step: int | None = None
    reports: list[tuple[int, float]] = field(default_factory=list)  # (step, s since spawn)
    first_decision_at: float | None = None  # first should_prune answer
    params_effective: dict[str, Any] | None = None
    opencl_platform: str | None = None
    outcome: TrialOutcome | None = None
    stop_reason: str | None = None  # timeout / interrupted: we stopped it
    kill_at: float | None = None  # when SIGTERM's grace runs out
    connection_open: bool = True
    log_path: Path | None = None  # the trial's own log (scheduler/_logs.py)

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.worker.process

    @property
    def connection(self) -> Connection:
        return self.worker.connection

    @property
    def log(self) -> IO[bytes]:
        return self.worker.log


@dataclass(frozen=True)
class Asked:
    """A trial claimed from the budget and asked, not yet given to a slot (scheduler.prefetch)."""

    trial: optuna.Trial
    attempt: int  # read at the claim, not when a slot takes it
    oom_retry: bool  # a retry of a trial that ran out of GPU memory: placed by free memory


@dataclass(frozen=True)
class FinishedTrial:
    number: int
    slot: str
    state: TrialState
    value: float | None
    duration_s: float
    fail_reason: str | None = None
    error: str | None = None
    log_path: str | None = None  # the trial's log: its last lines are shown for a failure


class Reporter(Protocol):
    """Live progress; called from the orchestrator's loop only."""

    def started(self, rt: RunningTrial) -> None: ...

    def finished(self, done: FinishedTrial) -> None: ...

    def tick(self, running: list[RunningTrial]) -> None: ...
