"""Messages between the orchestrator and a trial's child process (pickled over a socketpair).

child -> orchestrator                      orchestrator -> child
  ("started",)   objective about to run       Job (starts a trial)
  ("call", method, args, kwargs, tag)       ("ok", value, tag) / ("err", exception, tag)
     (args/kwargs plain values only: the orchestrator unpickles nothing else; the reply
     echoes the request's tag, None for a request without one: worker/_link.py)
  ("phase", name)  the objective's phase     None (reuse mode: exit now)
  ("result", TrialOutcome)  end of a trial     Prepare (start up now, before any trial)
  ("ready",)  start-up done (Prepare.announce)

A fresh child runs one Job and exits. A reuse child (``Job.reuse``) builds the objective
(and runs its setup) once, then waits for the next Job after each result. A reuse child of
the run's first wave, and a spare (scheduler.trials_per_gpu=auto), get a Prepare first: they
build the objective before any trial is asked for them. The first wave's say ``("ready",)``
when done (the loop asks their trials then); a spare says nothing until its first Job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpo_orchestrator import keys

if TYPE_CHECKING:
    import datetime

    from hpo_orchestrator.config import ObjectiveConfig

__all__ = ["ARTIFACT_CALL", "OBJECTIVE_ATTRS", "READ_CALLS", "TRIAL_METHODS", "Job", "Prepare",
           "TrialOutcome"]

# The optuna.Trial methods a child may call; everything else stays in the orchestrator.
TRIAL_METHODS = frozenset({
    "suggest_float", "suggest_int", "suggest_categorical", "suggest_uniform",
    "suggest_loguniform", "suggest_discrete_uniform", "report", "should_prune",
    "set_user_attr",
})

# What a child may read from the orchestrator's trial and study, by name (the proxy's
# ``relative_params``, ``study.user_attrs`` and ``study.system_attrs``): these change or cost a
# sampler call, so they are asked for when read, not sent with every Job (scheduler/_calls.py).
READ_CALLS = frozenset({"relative_params", "study.user_attrs", "study.system_attrs"})

# The ``hpo.*`` attrs an objective may set (the built-ins do: docs/DESIGN.md §2.3, "objective");
# every other ``hpo.`` key is the orchestrator's, and a write from a child is refused.
OBJECTIVE_ATTRS = frozenset({keys.PARAMS_EFFECTIVE, keys.OPENCL_PLATFORM, keys.WARNING,
                             keys.DEVICE_CHOICE})

# save_artifact's call, args (meta,): the child wrote the file into the store; the orchestrator
# checks it is there and records Optuna's artifact meta on the trial (scheduler/_artifact_meta.py).
ARTIFACT_CALL = "record_artifact"


@dataclass(frozen=True)
class Job:
    """What a child needs to run one trial."""

    trial_number: int
    objective: ObjectiveConfig  # the objective's validated config, unpickled as the same dataclass
    attempt: int = 1  # 2 and up for a retry (slot_info().attempt)
    reuse: bool = False  # keep the process for the next trial
    log_path: str | None = None  # the trial's log: the child sends its stdout/stderr there
    artifact_store: str | None = None  # the folder save_artifact writes to (artifacts.store)
    num_threads: int | None = None  # this trial's CPU threads (a reused process's change)
    # what the orchestrator killed at the end of this worker's previous trial: those that are
    # this worker's children (orphans come to it) it collects (worker/_reaping.py)
    collect: tuple[int, ...] = ()
    # What the trial's ``trial.study`` and ``trial.datetime_start`` answer without a call (the
    # study's name and directions do not change; worker/_study_view.py)
    study_name: str = ""
    directions: tuple[str, ...] = ("minimize",)  # StudyDirection names, lower case
    datetime_start: datetime.datetime | None = None


@dataclass(frozen=True)
class Prepare:
    """Start up ahead of the first trial: imports and the objective's setup run now, while
    the run opens its study (the first wave) or the slot waits for its GPU's level to rise
    (a spare; scheduler/_workers.py)."""

    objective: ObjectiveConfig
    log_path: str  # where the start-up's output goes; copied into the first trial's log
    announce: bool = False  # send ("ready",) once started up (or failed to)


@dataclass(frozen=True)
class TrialOutcome:
    """How the objective ended, as seen from inside the child.

    kind: ``value`` (``value`` set: a tuple when the objective returned several), ``pruned``,
    or ``error`` (``fail_reason`` is ``exception``, ``oom`` or ``disk_full``; ``error`` the last
    line of the message). ``children``: the process had child processes when the trial ended (True when
    it cannot tell); with none, the trial left nothing running (worker/_reaping.py).
    ``ended``: when the objective returned or raised (``time.time()`` in the child): the
    trial's recorded end, however late the orchestrator reads the result (a storage outage,
    a stopped orchestrator).
    """

    kind: str
    value: float | tuple[float, ...] | None = None
    fail_reason: str | None = None
    error: str | None = None
    traceback: str | None = None
    children: bool = True
    ended: float | None = None
