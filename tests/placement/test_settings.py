"""placement/_settings.py: ``scheduler.*`` decoded once into the numbers the slot pool, the
packer and the orchestrator read (``parallel`` and ``trials_per_gpu`` each ``int | "auto" |
None``, their meaning depending on each other and on the GPUs given)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from hpo_orchestrator.config import load_config
from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement import PlacementSettings, SlotPool, decode

GPUS = [GpuInfo(index=i, uuid=f"GPU-{i}", name="H100") for i in range(2)]


def _decoded(*overrides: str, gpus: list[GpuInfo] = GPUS, cores: int = 16) -> PlacementSettings:
    return decode(load_config(list(overrides)).scheduler, gpus, cores=cores, host="h",
                  run_folder=Path("/runs/s"))


@pytest.mark.parametrize(("overrides", "auto", "per_gpu", "cap", "concurrency"), [
    ((), True, 4, None, 2),  # both unset on GPUs: every GPU measured from 1
    (("scheduler.trials_per_gpu=auto",), True, 4, None, 2),
    (("scheduler.parallel=auto",), True, 4, None, 2),
    (("scheduler.parallel=3", "scheduler.trials_per_gpu=auto"), True, 4, 3, 2),
    (("scheduler.trials_per_gpu=2",), False, 2, 4, 4),  # parallel's default: GPUs x 2
    (("scheduler.parallel=auto", "scheduler.trials_per_gpu=2"), False, 2, None, 4),
    (("scheduler.parallel=3",), False, 2, 3, 3),  # ceil(3 / 2) places per GPU, capped at 3
    (("scheduler.max_trials_per_gpu=3",), True, 3, None, 2)])
def test_parallel_and_trials_per_gpu_decode_to_places(overrides: tuple[str, ...], auto: bool,
                                                      per_gpu: int, cap: int | None,
                                                      concurrency: int) -> None:
    settings = _decoded(*overrides)
    places = settings.places
    assert (places.auto, places.per_gpu, places.cap) == (auto, per_gpu, cap)
    assert places.start_level == (1 if auto else per_gpu)
    assert SlotPool(places).concurrency == concurrency


def test_the_start_up_overlap_is_off_unless_switched_on() -> None:
    """scheduler.startup_overlap reaches the packing rules (placement/_rules.py); off by
    default until paired GPU runs choose it (docs/QUALITY.md, "Defaults")."""
    assert not _decoded().policy.startup_overlap
    assert _decoded("scheduler.startup_overlap=true").policy.startup_overlap


def test_the_first_level_is_under_the_target_unless_fill_is_asked() -> None:
    """scheduler.first_level reaches the packing rules; ``under`` until paired GPU runs choose
    ``fill`` (docs/QUALITY.md, "Defaults")."""
    assert _decoded().policy.first_level == "under"
    assert _decoded("scheduler.first_level=fill").policy.first_level == "fill"


def test_a_host_without_gpus_runs_a_trial_per_core_or_per_threads() -> None:
    assert _decoded(gpus=[], cores=6).places.cap == 6
    assert SlotPool(_decoded(gpus=[], cores=6).places).concurrency == 6
    by_threads = _decoded("scheduler.threads_per_trial=4", gpus=[], cores=16)
    assert by_threads.places.cap == 4 and by_threads.threads_at(4) == 4
    assert len(SlotPool(by_threads.places).slots) == 4  # no slot past scheduler.parallel
    assert "one trial per 4 cores of 16" in by_threads.parallel_reason
    assert not _decoded(gpus=[]).auto  # nothing to measure without a GPU


def test_cpu_slots_beside_the_gpus_count_in_parallels_default() -> None:
    """cpu_slots=auto: a CPU slot per 8 cores the GPU slots (one per GPU) leave."""
    settings = _decoded("scheduler.trials_per_gpu=1", "scheduler.cpu_slots=auto", cores=32)
    assert (settings.places.cpu_slots, settings.places.cap) == (2, 4)
    assert "and 2 on CPU slots" in settings.parallel_reason
    pool = SlotPool(settings.places)
    assert [s.gpu_index for s in pool.slots] == [0, 1, None, None] and pool.concurrency == 4


def test_the_rest_is_read_once_and_frozen() -> None:
    """Cores, threads, host, run folder, worker mode and the packing policy: the packer and
    the orchestrator read these, not the raw configuration."""
    settings = _decoded("scheduler.threads_per_trial=3", "scheduler.worker_mode=fresh",
                        "scheduler.target_gpu_util=70", cores=12)
    assert (settings.cores, settings.threads, settings.host, settings.run_folder) == (
        12, 3, "h", Path("/runs/s"))
    assert not settings.reuse and settings.policy.target_util == 70.0
    assert settings.policy.max_per_gpu == 4
    assert settings.threads_at(4) == 3  # fixed threads stay fixed
    assert _decoded(cores=12).threads_at(4) == 3 and _decoded(cores=12).threads_at(0) == 12
    with pytest.raises(FrozenInstanceError):
        settings.cores = 8  # type: ignore[misc]
