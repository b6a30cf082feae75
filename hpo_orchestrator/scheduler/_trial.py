"""The orchestrator's model of its work: worker processes, trials on slots, finished trials.

Owned by the orchestrator's loop (single-threaded): nothing here is shared with the
telemetry thread, which only sees slot ids and pids.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from hpo_orchestrator.placement import RunningView, Slot
from hpo_orchestrator.worker import TrialOutcome

if TYPE_CHECKING:  # Optuna in annotations only: a run's first workers start before it loads
    import optuna
    from optuna.trial import TrialState

    from hpo_orchestrator.scheduler._channel import Channel
    from hpo_orchestrator.study import StudySpace

__all__ = ["Asked", "FinishedTrial", "Reporter", "RunningTrial", "Worker"]


@dataclass
class Worker:
    """A child process of one slot. Fresh mode: one trial. Reuse mode: many, one at a time."""

    process: subprocess.Popen[bytes]
    connection: Channel
    log: IO[bytes]
    cuda_visible_devices: str
    trials: int = 0  # trials started in it so far
    prepared: bool = False  # started up (imports, setup) before its first trial: a spare, the first wave
    starting: bool = False  # it will say ("ready",) when started up, and has not yet
    killed: list[int] = field(default_factory=list)  # its last trial's leftovers, killed (Job.collect)
    born: float = field(default_factory=time.monotonic)  # when its process was started
    born_epoch: float = field(default_factory=time.time)


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
    threads: int | None = None  # CPU threads the trial was given (its OpenMP/torch threads)
    phase: str | None = None
    last_step: int | None = None
    reports: list[tuple[int, float]] = field(default_factory=list)  # (step, s since spawn)
    first_decision_at: float | None = None  # first should_prune answer
    params_effective: dict[str, Any] | None = None
    opencl_platform: str | None = None
    device_choice: dict[str, Any] | None = None  # objective.device=auto's hpo.device_choice
    outcome: TrialOutcome | None = None
    stop_reason: str | None = None  # timeout / interrupted / protocol / reaped: we stopped it
    stop_error: str | None = None  # why we stopped it, when stop_reason alone does not say
    kill_at: float | None = None  # when SIGTERM's grace runs out
    connection_open: bool = True
    protocol_error: str | None = None  # "protocol: ...": the child's bytes broke the protocol
    reaped: bool = False  # another orchestrator finished the trial (we were stopped too long)
    paused_s: float = 0.0  # time the loop stood still (SIGSTOP): not counted against the timeout
    # stopped by its timeout: when its timed running reached it (its spawn plus the running
    # time the timeout counted): its recorded end, not SIGTERM's grace nor a pause later
    timed_out_epoch: float | None = None
    log_path: Path | None = None  # the trial's own log (scheduler/_logs.py)
    artifact_store: str | None = None  # artifacts.store, resolved: where save_artifact writes
    artifacts: list[dict[str, Any]] = field(default_factory=list)  # hpo.artifacts so far
    # handed to a first-wave worker whose start-up (imports, objective.setup) still ran: its
    # clock started with the worker; True until the worker says ready (hpo.setup_running)
    in_setup: bool = False
    setup_flagged: bool = False  # hpo.setup_running is true in the storage
    # a custom objective's space against the study's (study/_space.py); None: not checked
    space: StudySpace | None = None

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.worker.process

    def ended_epoch(self, now: float) -> float:
        """When the trial ended: its child's own time of the objective's return (sent with
        the result), not when the loop read it (the loop may have waited out a storage outage
        or been stopped meanwhile); kept within its spawn and ``now``, whatever a child says.
        A trial stopped by its timeout ended when its timed running reached the limit: the
        grace its process then took to die, and a pause of the loop, are not its running."""
        if self.timed_out_epoch is not None:
            return min(self.timed_out_epoch, now)
        ended = self.outcome.ended if self.outcome is not None else None
        return now if ended is None else min(max(ended, self.spawned_epoch), now)

    def view(self) -> RunningView:
        """What placement reads of it (placement/_view.py): numbers and names only."""
        from optuna.distributions import CategoricalDistribution  # loaded by the loop already

        return RunningView(
            gpu=self.slot.gpu_index, worker=self.worker.process.pid, started=self.spawned_at,
            threads=self.threads, params=dict(self.trial.params),
            choices={name: len(dist.choices) for name, dist in self.trial.distributions.items()
                     if isinstance(dist, CategoricalDistribution)},
            reports=tuple(self.reports), ended=self.outcome is not None)

    @property
    def connection(self) -> Channel:
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
    value: float | tuple[float, ...] | None  # a tuple: one per objective (several)
    duration_s: float
    fail_reason: str | None = None
    error: str | None = None
    log_path: str | None = None  # the trial's log: its last lines are shown for a failure
    # its params run again (interrupted, or retried after oom/killed/lost): it does not count
    # against n_trials, its re-run does
    retried: bool = False


class Reporter(Protocol):
    """Live progress; called from the orchestrator's loop only."""

    def started(self, rt: RunningTrial) -> None: ...

    def finished(self, done: FinishedTrial) -> None: ...

    def tick(self, running: list[RunningTrial]) -> None: ...

    def note(self, text: str) -> None:
        """Something the user should know now (a GPU skipped as busy, say)."""

    def setting_up(self, workers: int, elapsed_s: float) -> None:
        """The run waits for its first workers' start-up (imports, objective.setup)."""


class QuietReporter:
    """The reporter of a run nobody watches, or one with nothing to do (the study already has
    its trials)."""

    def __enter__(self) -> QuietReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def started(self, rt: RunningTrial) -> None:
        pass

    def finished(self, done: FinishedTrial) -> None:
        pass

    def tick(self, running: list[RunningTrial]) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def setting_up(self, workers: int, elapsed_s: float) -> None:
        pass
