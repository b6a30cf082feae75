"""The scheduler's settings as placement uses them, decoded once per run.

``scheduler.parallel`` and ``scheduler.trials_per_gpu`` each hold ``int | "auto" | None``, and
what they mean depends on each other, on the GPUs given and on the host's cores. They are read
here, once, into :class:`PlacementSettings` (frozen): the slot pool, the packer and the
orchestrator read its numbers and never the raw configuration. Nothing here does I/O: the
caller gives the GPUs, the cores (:func:`host_cores`), the host's name and the run folder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement._rules import PackingPolicy

__all__ = ["CPU_SLOT_CORES", "PlacementSettings", "Places", "decode", "host_cores", "objective_key",
           "places", "resolve_cpu_slots", "resolve_parallel", "threads_per_trial"]

CPU_SLOT_CORES = 8  # cpu_slots=auto: a CPU slot per 8 cores (docs/GPU.md: 8 threads ~ 16 at 40k)


def host_cores(configured: int | None = None) -> int:
    """CPU cores this orchestrator may use: ``scheduler.host_cores``, else its CPU affinity
    (what a Slurm job or taskset gave it)."""
    return configured if configured is not None else len(os.sched_getaffinity(0))


def objective_key(objective: Any) -> str:
    """What a run's trials run, in a word: the objective's name, with its target where it
    names one (objective=custom)."""
    target = getattr(objective, "target", None)
    return f"{objective.name}:{target}" if target else str(objective.name)


def threads_per_trial(configured: int | None, concurrency: int, cores: int | None = None) -> int:
    """CPU threads one trial may use so that ``concurrency`` trials do not oversubscribe."""
    if configured is not None:
        return configured
    return max(1, host_cores(cores) // max(concurrency, 1))


def resolve_cpu_slots(cpu_slots: int | str, gpu_places: int, cores: int | None = None) -> int:
    """``scheduler.cpu_slots`` as a number: auto gives the cores the GPU slots leave, one slot
    per CPU_SLOT_CORES; none without GPUs (every slot is a CPU slot there already)."""
    if not gpu_places:
        return 0
    if cpu_slots == "auto":
        return max(0, host_cores(cores) // CPU_SLOT_CORES - gpu_places)
    return int(cpu_slots)


def resolve_parallel(parallel: int | str | None, gpus: int, trials_per_gpu: int | str | None,
                     cores: int | None = None, threads: int | None = None,
                     cpu_slots: int = 0) -> tuple[int | str, str]:
    """``scheduler.parallel`` as the run uses it, and why (the run's start-up line says it).

    Unset, the run uses every GPU it was given, each packed with trials while measured
    throughput rises (``trials_per_gpu`` unset or auto: placement/_rules.py), or
    ``trials_per_gpu`` times; a host without GPUs runs one trial per ``threads`` cores (1: one
    per core).
    """
    if parallel is not None:
        return parallel, f"scheduler.parallel={parallel}"
    if gpus:
        beside = f" and {cpu_slots} on CPU slots" if cpu_slots else ""
        if not isinstance(trials_per_gpu, int):
            why = "trials_per_gpu=auto" if trials_per_gpu == "auto" else "scheduler.parallel unset"
            return "auto", f"1 per GPU to start, more while throughput rises{beside}; {why}"
        per_gpu = trials_per_gpu
        each = "one trial" if per_gpu == 1 else f"{per_gpu} trials"
        return gpus * per_gpu + cpu_slots, \
            f"{each} per GPU given{beside}, scheduler.parallel unset"
    cores = host_cores(cores)
    per_trial = threads or 1
    return max(1, cores // per_trial), (
        f"one trial per {'core' if per_trial == 1 else f'{per_trial} cores'} of {cores}, "
        "scheduler.parallel unset")


@dataclass(frozen=True)
class Places:
    """How many places a run has and who moves them: the slot pool is built from this."""

    gpus: tuple[GpuInfo, ...]
    # trials_per_gpu=auto, or parallel=auto (what resolve_parallel makes of it unset on a GPU
    # host) with trials_per_gpu unset: each GPU's level is measured (placement/_rules.py);
    # a number for either means exactly that many
    auto: bool
    per_gpu: int  # slots per GPU (auto: the most its level may reach); 0 without GPUs
    cpu_slots: int  # CPU slots: beside the GPU slots, or every slot on a host without GPUs
    cap: int | None  # scheduler.parallel as a number: the most trials at once (None: every slot)

    @property
    def start_level(self) -> int:
        """Each GPU's level at the start: 1 to be measured up from, else every slot."""
        return 1 if self.auto else self.per_gpu


def places(gpus: Sequence[GpuInfo], parallel: int | str, trials_per_gpu: int | str | None,
           max_per_gpu: int, cores: int, cpu_slots: int = 0) -> Places:
    """The places of ``parallel`` (as :func:`resolve_parallel` made it) and ``trials_per_gpu``."""
    auto = bool(gpus) and (trials_per_gpu == "auto"
                           or (trials_per_gpu is None and parallel == "auto"))
    cap = parallel if isinstance(parallel, int) else None
    if not gpus:
        return Places((), False, 0, cap if cap is not None else cores, cap)
    if auto:
        per_gpu = max_per_gpu
    elif isinstance(trials_per_gpu, int):
        per_gpu = trials_per_gpu
    else:
        assert cap is not None  # parallel=auto alone is auto packing
        per_gpu = math.ceil(max(cap - cpu_slots, 1) / len(gpus))
    return Places(tuple(gpus), auto, per_gpu, cpu_slots, cap)


@dataclass(frozen=True)
class PlacementSettings:
    """``config.scheduler`` decoded for placement (:func:`decode`): read by the slot pool, the
    packer and the orchestrator."""

    places: Places
    parallel_reason: str  # why the run runs as many trials at once: the start-up line says it
    cores: int  # CPU cores the run's trials share
    threads: int | None  # scheduler.threads_per_trial; None: the cores over the trials at once
    host: str  # the name in hpo.host and hpo.packing.<host>
    run_folder: Path  # the study's run folder: trial logs, process records
    reuse: bool  # worker_mode=reuse: a worker's first trial of a kind is a warm-up
    policy: PackingPolicy = field(default_factory=PackingPolicy)
    # the objective the trials run ("torch_mlp", "custom:mypkg.objective:objective"): a level
    # settled in an earlier run is the start only for the same one (placement/_packer.py)
    objective: str = ""

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self.places.gpus

    @property
    def auto(self) -> bool:
        return self.places.auto

    def threads_at(self, concurrency: int) -> int:
        """CPU threads for each of ``concurrency`` trials at once (fixed ones as set)."""
        return threads_per_trial(self.threads, concurrency, self.cores)


def decode(scheduler: Any, gpus: Sequence[GpuInfo], *, cores: int, host: str,
           run_folder: Path, objective: str = "") -> PlacementSettings:
    """``scheduler`` (a SchedulerConfig) with the GPUs given and the cores found;
    ``objective`` names what the trials run (:func:`objective_key`)."""
    fixed = scheduler.trials_per_gpu if isinstance(scheduler.trials_per_gpu, int) else 1
    cpu_slots = resolve_cpu_slots(scheduler.cpu_slots, len(gpus) * fixed, cores)
    parallel, reason = resolve_parallel(scheduler.parallel, len(gpus), scheduler.trials_per_gpu,
                                        cores, scheduler.threads_per_trial, cpu_slots)
    return PlacementSettings(
        places=places(gpus, parallel, scheduler.trials_per_gpu, scheduler.max_trials_per_gpu,
                      cores, cpu_slots),
        parallel_reason=reason, cores=cores, threads=scheduler.threads_per_trial, host=host,
        run_folder=run_folder, reuse=scheduler.worker_mode == "reuse", objective=objective,
        policy=PackingPolicy(target_util=float(scheduler.target_gpu_util),
                             max_per_gpu=scheduler.max_trials_per_gpu,
                             startup_overlap=scheduler.startup_overlap,
                             first_level=scheduler.first_level))
