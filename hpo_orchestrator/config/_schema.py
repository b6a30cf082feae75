"""Structured configs: one dataclass per configurable thing.

Hydra composes the YAML in ``conf/``; OmegaConf checks key names and types against these
dataclasses; :func:`Config.validate` then checks what types cannot express (ranges, choices,
cross-field rules). Everything is checked once, before anything is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from hpo_orchestrator.config._checks import _positive_int, _require, _within_host
from hpo_orchestrator.config._objectives import (
    CustomObjectiveConfig,
    LightGBMObjectiveConfig,
    TorchMLPObjectiveConfig,
)
from hpo_orchestrator.config._search import PrunerConfig, SamplerConfig
from hpo_orchestrator.config._space import check_params

__all__ = [
    "MAX_STUDY_NAME",
    "ArtifactsConfig",
    "Config",
    "CustomObjectiveConfig",
    "LightGBMObjectiveConfig",
    "ObjectiveConfig",
    "SchedulerConfig",
    "StorageConfig",
    "StudyConfig",
    "TelemetryConfig",
    "TorchMLPObjectiveConfig",
]

MAX_STUDY_NAME = 512  # characters: Optuna's studies.study_name column
FIRST_LEVELS = ("under", "fill")  # scheduler.first_level (placement/_rules.py, _level_for)


# --- the run -----------------------------------------------------------------------------


@dataclass
class SchedulerConfig:
    # Trials at once on this host. null (the default) or auto: every GPU this run was given,
    # each at the level trials_per_gpu sets (measured, when trials_per_gpu is auto or unset);
    # on a host without GPUs, cores / threads_per_trial (one per core unless threads_per_trial
    # is set). An integer: at most that many, trials_per_gpu then ceil(parallel / GPUs).
    parallel: Any = None
    # auto: every GPU NVML finds (CPU slots when none); none: CPU slots; or a list of NVML indices.
    gpus: Any = "auto"
    # Trials sharing one GPU at a time; null: auto, or ceil(parallel / number of GPUs) where
    # parallel is a number. auto: start at 1 per GPU, go to target_gpu_util / the first
    # trial's steady utilization (as memory and cores allow), then add or remove one while
    # the steps (or trials) finished per minute rise (docs/HOSTS.md, "Filling the GPUs").
    # An integer: exactly that many.
    trials_per_gpu: Any = None
    max_trials_per_gpu: int = 4  # the most trials_per_gpu=auto puts on one GPU
    # trials_per_gpu=auto in reuse mode: each GPU keeps a spare worker, started up (imports,
    # objective.setup), for the place above its level; false when the setup holds too much
    # host or GPU memory to keep one waiting.
    spare_workers: bool = True
    # trials_per_gpu=auto adds a trial on a GPU only while its utilization is under this (%):
    # one more trial can raise throughput by at most 100/util, 1.25x at 80 %.
    target_gpu_util: float = 80.0
    # trials_per_gpu=auto: while a GPU's first trial starts up (imports, data, CUDA context:
    # no step reported, the GPU idle), it takes one more, confirmed or undone by their first
    # steps (docs/HOSTS.md, "Filling the GPUs"); false: the first level waits for the steps.
    startup_overlap: bool = False
    # trials_per_gpu=auto: the first jump from one trial a GPU goes to. under: the most
    # trials whose shares of utilization stay under target_gpu_util; fill: the fewest that
    # reach it, where the climb one at a time would end, without timing the level below first
    # (docs/HOSTS.md, "Filling the GPUs").
    first_level: str = "under"
    # CPU cores this orchestrator may use (threads per trial, trials_per_gpu=auto's core
    # check, parallel=auto without GPUs); null: its CPU affinity.
    host_cores: int | None = None
    # null: no limit. A trial past it is stopped (its process tree terminated, then killed).
    trial_timeout_s: float | None = None
    # Seconds between SIGTERM and SIGKILL when stopping a trial.
    kill_grace_s: float = 5.0
    # CPU threads each trial may use; null: the machine's cores divided by `parallel`.
    threads_per_trial: int | None = None
    # CPU slots beside the GPU slots (a host with GPUs): trials there get an empty
    # CUDA_VISIBLE_DEVICES and train on the CPU (LightGBM on small data is faster there:
    # docs/GPU.md). auto: one per CPU_SLOT_CORES cores left after one per GPU slot; 0: none.
    # Counted in scheduler.parallel's default; the cores are shared by every slot's trials.
    cpu_slots: Any = 0
    # Re-runs of the same params after a failure that was not the objective's fault (oom,
    # killed, lost). Retries do not count against study.n_trials.
    max_retries: int = 1
    # fresh: a new process per trial (strongest isolation); reuse: one long-lived process per
    # slot, pinned at its birth, that imports and runs the objective's setup once, then runs
    # trials one after another; replaced after a failure or max_trials_per_worker trials.
    worker_mode: str = "reuse"
    max_trials_per_worker: int = 100
    # Trials asked ahead of a free slot, so a slot that frees up starts its next trial at once
    # (the sampler then decides that trial before the latest results are in); 0: ask on demand.
    prefetch: int = 1
    # A GPU that no trial of ours uses but that has this much memory in use, or this
    # utilization, is busy with someone else's work: skipped, and looked at again later.
    avoid_busy_gpus: bool = True
    busy_gpu_mem_mib: float = 2048.0
    busy_gpu_util: float = 50.0
    # Host-wide slot leases (lock files); null: $HPO_ORCHESTRATOR_LEASE_DIR or
    # <tmp>/hpo-orchestrator-leases. Orchestrators sharing GPUs must share this folder.
    lease_dir: str | None = None
    # The name recorded in hpo.host; null: this machine's host name.
    host: str | None = None
    # Each trial's output goes to <log_dir>/<study>/trial-<N>.log; null: hpo-runs/ beside the
    # sqlite database (or in the current folder for a server database).
    log_dir: str | None = None
    # A trial's log over this size is rotated to trial-<N>.log.1 (so at most twice this).
    log_max_mib: float = 10.0

    def validate(self, path: str) -> None:
        self._validate_counts(path)
        self._validate_gpu_use(path)
        self._validate_workers(path)

    def _validate_counts(self, path: str) -> None:
        """How many trials, places and threads: numbers (or auto) the host can hold."""
        for key in ("parallel", "trials_per_gpu"):
            value = getattr(self, key)
            if value not in ("auto", None):
                _require(value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                                             and value >= 1),
                         f"{path}.{key}", f"expected an integer >= 1 or auto, got {value!r}",
                         f"e.g. scheduler.{key}=2 or scheduler.{key}=auto")
        # counts of trial processes, or of places for them: within what the host can hold
        for key in ("parallel", "trials_per_gpu", "max_trials_per_gpu", "cpu_slots", "prefetch",
                    "host_cores", "threads_per_trial"):
            _within_host(getattr(self, key), f"{path}.{key}")
        _positive_int(self.prefetch, f"{path}.prefetch", minimum=0)
        _positive_int(self.max_trials_per_gpu, f"{path}.max_trials_per_gpu")
        if self.host_cores is not None:
            _positive_int(self.host_cores, f"{path}.host_cores")
        if self.threads_per_trial is not None:
            _positive_int(self.threads_per_trial, f"{path}.threads_per_trial")
        _require(self.cpu_slots == "auto" or (isinstance(self.cpu_slots, int)
                                              and not isinstance(self.cpu_slots, bool)
                                              and self.cpu_slots >= 0),
                 f"{path}.cpu_slots", f"expected an integer >= 0 or auto, got {self.cpu_slots!r}",
                 "e.g. scheduler.cpu_slots=2 or scheduler.cpu_slots=auto")

    def _validate_gpu_use(self, path: str) -> None:
        """Which GPUs, and when one counts as busy or full."""
        _require(self.busy_gpu_mem_mib >= 0, f"{path}.busy_gpu_mem_mib",
                 f"expected MiB >= 0, got {self.busy_gpu_mem_mib!r}")
        _require(0 <= self.busy_gpu_util <= 100, f"{path}.busy_gpu_util",
                 f"expected a percentage 0-100, got {self.busy_gpu_util!r}")
        gpus_ok = self.gpus in ("auto", "none") or (
            isinstance(self.gpus, list)
            and all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in self.gpus)
        )
        _require(gpus_ok, f"{path}.gpus",
                 f"expected auto, none or a list of GPU indices, got {self.gpus!r}",
                 "e.g. scheduler.gpus=[0,1]")
        _require(isinstance(self.target_gpu_util, (int, float)) and 0 < self.target_gpu_util <= 100,
                 f"{path}.target_gpu_util", f"expected a percentage 1-100, got {self.target_gpu_util!r}")
        _require(self.first_level in FIRST_LEVELS, f"{path}.first_level",
                 f"expected {' or '.join(FIRST_LEVELS)}, got {self.first_level!r}")

    def _validate_workers(self, path: str) -> None:
        """A trial's process: how it runs, how long, how often again, how much it may log."""
        _positive_int(self.max_retries, f"{path}.max_retries", minimum=0)
        _require(self.worker_mode in ("fresh", "reuse"), f"{path}.worker_mode",
                 f"expected fresh or reuse, got {self.worker_mode!r}")
        _positive_int(self.max_trials_per_worker, f"{path}.max_trials_per_worker")
        if self.trial_timeout_s is not None:
            _require(self.trial_timeout_s > 0, f"{path}.trial_timeout_s",
                     f"expected seconds > 0 or null, got {self.trial_timeout_s!r}")
        _require(self.kill_grace_s >= 0, f"{path}.kill_grace_s",
                 f"expected seconds >= 0, got {self.kill_grace_s!r}")
        _require(isinstance(self.log_max_mib, (int, float)) and self.log_max_mib > 0,
                 f"{path}.log_max_mib", f"expected MiB > 0, got {self.log_max_mib!r}")


@dataclass
class StorageConfig:
    url: str = "sqlite:///hpo.db"
    # Heartbeats let any orchestrator find trials whose owner died (they become FAIL, 'lost').
    heartbeat_interval_s: int = 10
    grace_period_s: int | None = None  # null: 3 x heartbeat_interval_s
    # How long a run waits out transient storage trouble (a lock, a dropped connection, a
    # failover), retrying with backoff, before it stops with exit 1 and names the cause.
    retry_s: float = 120.0
    # How stale the run loop's mirror of the study may get: the longest before another
    # orchestrator's trials reach this one's sampler (hpo_orchestrator/study/_storage.py).
    refresh_s: float = 1.0

    @property
    def grace_s(self) -> int:
        """Seconds without a heartbeat after which a RUNNING trial is failed as lost."""
        return self.grace_period_s or 3 * self.heartbeat_interval_s

    def validate(self, path: str) -> None:
        _require("://" in self.url, f"{path}.url", "expected a SQLAlchemy URL",
                 "e.g. storage.url=sqlite:///hpo.db or postgresql+psycopg://user@host/db")
        _positive_int(self.heartbeat_interval_s, f"{path}.heartbeat_interval_s")
        _require(isinstance(self.retry_s, (int, float)) and not isinstance(self.retry_s, bool)
                 and 0 <= self.retry_s <= 86400, f"{path}.retry_s",
                 f"expected seconds between 0 and 86400, got {self.retry_s!r}",
                 "e.g. storage.retry_s=120 (0: stop at the first storage error)")
        _require(isinstance(self.refresh_s, (int, float)) and not isinstance(self.refresh_s, bool)
                 and self.refresh_s >= 0, f"{path}.refresh_s",
                 f"expected seconds >= 0, got {self.refresh_s!r}")
        if self.grace_period_s is not None:
            _require(self.grace_period_s > self.heartbeat_interval_s, f"{path}.grace_period_s",
                     "must be longer than storage.heartbeat_interval_s")


_DIRECTIONS = ("minimize", "maximize")


@dataclass
class StudyConfig:
    name: str = "hpo"
    # One objective: minimize (the default) or maximize. Several: directions, one per value the
    # objective returns (a Pareto front; Optuna cannot prune them). Not both.
    direction: str | None = None
    directions: list[str] | None = None
    # Trials that must end (COMPLETE, PRUNED or FAIL) in the study as a whole; a restart resumes.
    n_trials: int = 40
    # Run this many trials more than the study has ended so far (n_trials is then ignored).
    add_trials: int | None = None
    # Stop the run (exit 1) when its first fail_fast trials all failed with the same error; 0: never.
    fail_fast: int = 5
    # Stop the run (exit 1) once more than this many of its trials failed; null: no limit.
    max_failures: int | None = None
    # Allow a run whose objective or search space differs from the study's recorded one.
    allow_mixed: bool = False
    # A limit on this run's wall time: no trial starts after it; running ones finish, or are
    # stopped timeout_grace_s later (null: they finish however long they take).
    timeout_s: float | None = None
    timeout_grace_s: float | None = None
    # Param sets the study tries first (Optuna's enqueue_trial), each once per study.
    enqueue: list[dict[str, Any]] = field(default_factory=list)

    @property
    def objectives(self) -> list[str]:
        """The study's directions, one per objective value ('minimize' / 'maximize')."""
        return list(self.directions) if self.directions else [self.direction or "minimize"]

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def validate(self, path: str) -> None:
        _require(bool(self.name.strip()), f"{path}.name", "must not be empty")
        # Optuna's studies.study_name is VARCHAR(512): PostgreSQL and MySQL refuse a longer
        # one only when the study is created; sqlite would take it. Refused on every backend
        # so a study's name fits wherever its database moves.
        _require(len(self.name) <= MAX_STUDY_NAME, f"{path}.name",
                 f"{len(self.name)} characters, Optuna stores at most {MAX_STUDY_NAME}",
                 "choose a shorter study.name")
        _require(self.direction is None or self.direction in _DIRECTIONS, f"{path}.direction",
                 f"expected minimize or maximize, got {self.direction!r}")
        if self.directions is not None:
            _require(self.direction is None, f"{path}.directions",
                     "given together with study.direction: one of them says the study's directions",
                     "pass study.directions=[minimize,maximize] alone for several objectives, or "
                     "study.direction=minimize alone for one")
            _require(bool(self.directions) and all(d in _DIRECTIONS for d in self.directions),
                     f"{path}.directions", "expected a non-empty list of minimize / maximize, "
                     f"got {self.directions!r}", "e.g. study.directions=[minimize,maximize]")
        _positive_int(self.n_trials, f"{path}.n_trials")
        if self.add_trials is not None:
            _positive_int(self.add_trials, f"{path}.add_trials")
        _positive_int(self.fail_fast, f"{path}.fail_fast", minimum=0)
        if self.max_failures is not None:
            _positive_int(self.max_failures, f"{path}.max_failures", minimum=0)
        for key in ("timeout_s", "timeout_grace_s"):
            value = getattr(self, key)
            _require(value is None or (isinstance(value, (int, float)) and math.isfinite(value)
                                       and value > 0), f"{path}.{key}",
                     f"expected seconds > 0 or null, got {value!r}")
        _require(self.timeout_grace_s is None or self.timeout_s is not None,
                 f"{path}.timeout_grace_s", "applies only with study.timeout_s",
                 "e.g. study.timeout_s=3600 study.timeout_grace_s=60")


@dataclass
class TelemetryConfig:
    """GPU/CPU sampling of every trial (hpo_telemetry table and hpo.* aggregates)."""

    enabled: bool = True
    interval_s: float = 1.0
    # Phases (marked with hpo_orchestrator.phase) in which the GPU is expected to work: low
    # utilization there is a finding; in other phases (data, validate) it is not.
    compute_phases: list[str] = field(default_factory=lambda: ["train"])
    # Retention of hpo_telemetry: a trial's samples are kept at full resolution until its last
    # sample is keep_full_s old, then averaged down to at most max_rows_per_trial rows per GPU
    # (its hpo.* aggregates never change). docs/RECORDING.md, "Telemetry retention".
    keep_full_s: float = 3600.0
    max_rows_per_trial: int = 300

    def validate(self, path: str) -> None:
        _require(isinstance(self.keep_full_s, (int, float)) and self.keep_full_s >= 0,
                 f"{path}.keep_full_s", f"expected seconds >= 0, got {self.keep_full_s!r}")
        _positive_int(self.max_rows_per_trial, f"{path}.max_rows_per_trial", minimum=2)
        _require(isinstance(self.interval_s, (int, float)) and math.isfinite(self.interval_s)
                 and self.interval_s >= 0.05, f"{path}.interval_s",
                 f"expected seconds >= 0.05, got {self.interval_s!r}")
        _require(bool(self.compute_phases) and all(isinstance(p, str) and p for p in self.compute_phases),
                 f"{path}.compute_phases", f"expected a non-empty list of phase names, "
                 f"got {self.compute_phases!r}", "e.g. telemetry.compute_phases=[train,finetune]")


@dataclass
class ArtifactsConfig:
    """Where the objectives' files go (hpo_orchestrator.save_artifact; Optuna's artifact store)."""

    # A folder every host of the study (and whoever fetches the files) can reach; null:
    # <run folder>/artifacts, the run folder being hpo-runs/<study>/ beside the sqlite database.
    store: str | None = None

    def validate(self, path: str) -> None:
        _require(self.store is None or (isinstance(self.store, str) and bool(self.store.strip())),
                 f"{path}.store", f"expected a folder or null, got {self.store!r}",
                 "e.g. artifacts.store=/shared/hpo-artifacts")
        _require(self.store is None or "://" not in self.store, f"{path}.store",
                 f"only a folder is supported, got {self.store!r}",
                 "mount the bucket or share the folder between hosts (e.g. NFS) and give its path")


if TYPE_CHECKING:
    ObjectiveConfig: TypeAlias = LightGBMObjectiveConfig | TorchMLPObjectiveConfig | CustomObjectiveConfig
else:
    # OmegaConf cannot type a node as a union of dataclasses: at run time the node is untyped
    # and the group's own schema (base_<option>, registered in config/_load.py) types it.
    ObjectiveConfig = Any

# omegaconf.MISSING: a value that composition must provide (here: the defaults list picks
# one option per group). Spelled out so that a trial's child process, which unpickles the
# objective's config from this module, does not import OmegaConf.
_FROM_GROUP: Any = "???"


@dataclass
class Config:
    objective: ObjectiveConfig = _FROM_GROUP
    pruner: PrunerConfig = _FROM_GROUP
    sampler: SamplerConfig = _FROM_GROUP
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    artifacts: ArtifactsConfig = field(default_factory=ArtifactsConfig)

    def validate(self) -> Config:
        for key in ("objective", "pruner", "sampler", "scheduler", "storage", "study", "telemetry",
                    "artifacts"):
            getattr(self, key).validate(key)
        _require(not self.study.multi_objective or self.objective.name == "custom",
                 "study.directions", f"objective {self.objective.name} returns one value; "
                 f"study.directions asks for {len(self.study.objectives)}",
                 "several objectives need objective=custom with objective.target=pkg.mod:fn "
                 "returning one number per direction (docs/OBJECTIVES.md, 'Several objectives')")
        check_params(self.study.enqueue, self.objective.name,
                     getattr(self.objective, "search_space", None), "study.enqueue")
        return self
