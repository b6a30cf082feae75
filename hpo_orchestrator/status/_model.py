"""What ``status`` reports: plain dataclasses shared by the collector, the findings and the
renderers (kept apart from all three so none of them imports another in a circle)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DeviceUse", "Finding", "StateStats", "StatusReport", "StudyFacts"]


@dataclass
class Finding:
    code: str  # stable identifier: idle_gpu, low_gpu_util, slow_startup, ...
    severity: str  # warning / info
    message: str
    advice: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class StateStats:
    count: int = 0
    mean_s: float | None = None
    median_s: float | None = None
    max_s: float | None = None


@dataclass
class DeviceUse:
    """One device (a GPU, or a host's CPU slots) over the study."""

    device: str
    host: str | None
    gpu_index: int | None
    trials: int = 0
    states: dict[str, int] = field(default_factory=dict)
    # share of the time the study had a trial running on this device's host (``active_s``) with
    # >= 1 trial on this device: the per-device table's busy
    busy_fraction: float | None = None
    busy_fraction_queued: float | None = None  # the same, up to the host's last start
    active_s: float | None = None
    active_queued_s: float | None = None  # up to the host's last start: trials still waited
    util_mean: float | None = None  # GPU utilization %, trial-time weighted
    util_compute_mean: float | None = None  # ... in the compute phase only
    energy_kj: float | None = None


@dataclass
class StudyFacts:
    """What the findings need besides the report: a few per-trial facts, pre-filtered in SQL."""

    config: dict[str, Any]
    max_complete_step: int | None
    unverified: list[tuple[int, str | None]]  # (number, OpenCL platform) with gpu_verified false
    mismatches: list[tuple[int, dict[str, Any]]]  # (number, {param: [suggested, effective]})
    # (number, hpo.fail_reason, hpo.error) of failed trials that were not retried
    failures: list[tuple[int, str | None, str | None]] = field(default_factory=list)
    # (trials with both, median startup_s, median first_decision_s); None: no trial has both
    startup: tuple[int, float, float] | None = None
    # (host, gpu index) -> seconds other studies' finished trials ran on that GPU between the
    # study's first and last start; read only for the GPUs idle_gpu would name
    other_studies_s: dict[tuple[str | None, int | None], float] = field(default_factory=dict)
    # per host, the latest time other runs of the host shared the study's cores (study attr
    # hpo.shared_cores.<host>, placement/_cores.py), with the host named
    shared_cores: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StatusReport:
    study: str
    direction: str
    n_trials_target: int | None
    states: dict[str, StateStats]
    prune_rate: float | None
    prune_steps: dict[int, int]  # step at which trials were pruned -> how many
    best: dict[str, Any] | None
    per_device: list[DeviceUse]
    running: list[dict[str, Any]]
    fail_reasons: dict[str, int] = field(default_factory=dict)
    wall_s: float | None = None  # first start to last end (or now), gaps between runs included
    # Seconds with at least one trial running on a device: the wall time without those gaps
    # (None where the study ran on several hosts: the tally keeps one union per host)
    active_s: float | None = None
    # FAIL attempts whose params ran again (interrupted, or retried for oom/killed/lost): they
    # do not count against n_trials, their re-run does
    retried: int = 0
    # FAIL trials asked ahead and put back before any slot took them (no hpo.pid): they never
    # ran, and count neither against n_trials nor as re-run attempts
    never_ran: int = 0
    findings: list[Finding] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)  # RUNNING in Optuna, asked ahead of a slot
    min_resource_auto: dict[str, Any] | None = None  # study attr hpo.pruner.min_resource_auto
    # pruner.tune=auto (pruning/_tune_auto.py): whether the study runs with it, every switch
    # (hpo.pruner_history) and the latest replay's verdict (hpo.pruner_tuning)
    pruner_tune: bool = False
    pruner_history: list[dict[str, Any]] = field(default_factory=list)
    pruner_tuning: dict[str, Any] | None = None
    last_failed: int | None = None  # the latest failed trial (not interrupted): logs one away
    # Per host, hpo.packing.<host> with "host" added: trials per GPU, and every change that
    # scheduler.trials_per_gpu=auto made (docs/DESIGN.md §2.3).
    packing: list[dict[str, Any]] = field(default_factory=list)
    # Per host, hpo.device_choice.<host> with "host" added: the latest measurement of
    # objective.device=auto (learner, reason, timings; docs/DESIGN.md §4).
    device_choices: list[dict[str, Any]] = field(default_factory=list)
    # One per objective; with several, ``best`` is None and ``best_trials`` holds the Pareto
    # front ({number, values, params}), as Optuna's study.best_trials.
    directions: list[str] = field(default_factory=list)
    best_trials: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["prune_steps"] = {str(k): v for k, v in self.prune_steps.items()}
        return data
