"""Slot pool: GPUs x trials_per_gpu, spreading, and the GPU list check."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement import (
    SlotPool,
    resolve_cpu_slots,
    resolve_gpus,
    resolve_parallel,
    threads_per_trial,
)
from hpo_orchestrator.placement._leases import LeaseDir
from hpo_orchestrator.testing import FakeGpuBackend


def test_spreads_over_gpus_and_caps_per_gpu() -> None:
    gpus = FakeGpuBackend.from_spec("2").gpus()
    pool = SlotPool.of(gpus, parallel=4, trials_per_gpu=None)
    taken = [pool.acquire() for _ in range(5)]
    assert taken[4] is None
    on = [s.gpu.index for s in taken[:4] if s and s.gpu]
    assert sorted(on) == [0, 0, 1, 1]
    assert on[:2] == [0, 1]  # the first two trials go to different GPUs


def test_a_freed_slot_goes_to_the_least_loaded_gpu() -> None:
    """After trials end unevenly the next trial goes to the GPU with fewer trials, not to the
    free slot with the lowest id (slots are numbered GPU by GPU, so on a fresh pool the two
    orders agree and only this case tells them apart)."""
    gpus = FakeGpuBackend.from_spec("2").gpus()
    pool = SlotPool.of(gpus, parallel=6, trials_per_gpu=3)
    taken = [pool.acquire() for _ in range(5)]  # GPU 0 runs three, GPU 1 two
    for slot in taken:
        assert slot is not None and slot.gpu is not None
        if slot.id in (0, 1, 3):  # GPU 0 keeps two, GPU 1 none; slot 0 (GPU 0) is free
            pool.release(slot)
    nxt = pool.acquire()
    assert nxt is not None and nxt.gpu is not None and nxt.gpu.index == 1


def test_trials_per_gpu_limits_concurrency() -> None:
    gpus = FakeGpuBackend.from_spec("2").gpus()
    pool = SlotPool.of(gpus, parallel=8, trials_per_gpu=1)
    assert pool.concurrency == 2
    first, second = pool.acquire(), pool.acquire()
    assert pool.acquire() is None
    assert first and second
    pool.release(first)
    again = pool.acquire()
    assert again is not None and again.gpu == first.gpu


def test_cpu_slots_have_empty_cuda_visible_devices() -> None:
    pool = SlotPool.of([], parallel=3, trials_per_gpu=None)
    slots = [pool.acquire() for _ in range(3)]
    assert all(s is not None and s.gpu is None and s.cuda_visible_devices == "" for s in slots)


def test_gpu_slots_pin_the_gpu_by_uuid() -> None:
    """CUDA_VISIBLE_DEVICES names the GPU by UUID: an index would be another GPU under CUDA's
    fastest-first order or inside a device cgroup (Slot.cuda_visible_devices)."""
    gpus = FakeGpuBackend.from_spec("2").gpus()
    pool = SlotPool.of(gpus, parallel=2, trials_per_gpu=1)
    slots = [pool.acquire(), pool.acquire()]
    assert [s.cuda_visible_devices if s else None for s in slots] == [g.uuid for g in gpus]
    assert all(g.uuid.startswith("GPU-") for g in gpus)


def test_a_released_lease_frees_the_slot_for_another_orchestrator(tmp_path: Path) -> None:
    """Two pools on one lease folder (two orchestrators of this host): a GPU slot held by
    one is skipped by the other until released (the kernel's flock, _leases.py)."""
    gpus = FakeGpuBackend.from_spec("1").gpus()
    first = SlotPool.of(gpus, parallel=1, trials_per_gpu=1, leases=LeaseDir(tmp_path))
    second = SlotPool.of(gpus, parallel=1, trials_per_gpu=1, leases=LeaseDir(tmp_path))
    held = first.acquire()
    assert held is not None and second.acquire() is None
    assert list(LeaseDir(tmp_path).holders(gpus[0].uuid)) == [0]
    first.release(held, keep_lease=True)  # a reuse worker stays on it: still taken
    assert second.acquire() is None
    first.drop_lease(held.id)
    assert LeaseDir(tmp_path).holders(gpus[0].uuid) == {}
    assert second.acquire() is not None


def test_a_waiting_orchestrator_gets_the_next_turn_on_a_gpu(tmp_path: Path) -> None:
    """The holder's idle lease yields to an orchestrator that found the GPU taken, and the
    holder takes no slot of it while the other waits longer (issue 15: reuse workers)."""
    gpus = FakeGpuBackend.from_spec("1").gpus()
    first = SlotPool.of(gpus, parallel=1, trials_per_gpu=1, leases=LeaseDir(tmp_path))
    second = SlotPool.of(gpus, parallel=1, trials_per_gpu=1, leases=LeaseDir(tmp_path))
    held = first.acquire()
    assert held is not None and not first.yields(held)
    first.release(held, keep_lease=True)  # its reuse worker waits for the next trial
    assert second.acquire() is None  # taken: second now waits for the GPU
    assert first.yields(held) and first.acquire() is None  # second's turn; first waits now
    first.drop_lease(held.id)  # the idle worker retired
    taken = second.acquire()
    assert taken is not None and second.yields(taken)  # the next turn is first's
    second.release(taken)
    assert first.acquire() is not None


def test_a_dead_waiter_is_no_longer_waiting(tmp_path: Path) -> None:
    gpus = FakeGpuBackend.from_spec("1").gpus()
    pool = SlotPool.of(gpus, parallel=1, trials_per_gpu=1, leases=LeaseDir(tmp_path))
    held = pool.acquire()
    assert held is not None
    dead = tmp_path / f"{gpus[0].uuid}.waiting.999999-0"
    dead.write_text("1.0")  # no process holds its lock
    assert not pool.yields(held) and not dead.exists()


@pytest.mark.parametrize(("wanted", "expected"), [("auto", [0, 1]), ("none", []), ([1], [1])])
def test_resolve_gpus(wanted: object, expected: list[int]) -> None:
    backend = FakeGpuBackend.from_spec("2")
    assert [g.index for g in resolve_gpus(wanted, backend)] == expected


def test_nonexistent_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GPU 5 does not exist"):
        resolve_gpus([5], FakeGpuBackend.from_spec("2"))


def test_threads_divided_among_trials() -> None:
    assert threads_per_trial(3, 4) == 3
    assert threads_per_trial(None, 10_000) == 1
    assert threads_per_trial(None, 4, cores=16) == 4  # 4 trials share 16 cores


def test_oom_retry_goes_to_the_gpu_with_most_free_memory() -> None:
    gpus = [GpuInfo(index=i, uuid=f"GPU-{i}", name="x", memory_total_mib=80_000) for i in range(2)]
    pool = SlotPool.of(gpus, parallel=4, trials_per_gpu=2)
    first = pool.acquire()
    assert first is not None and first.gpu is not None and first.gpu.index == 0
    # GPU 1 is idle but nearly full (a foreign process): the retry still prefers GPU 0
    retry = pool.acquire(free_mib={0: 60_000.0, 1: 2_000.0})
    assert retry is not None and retry.gpu is not None and retry.gpu.index == 0
    plain = pool.acquire()
    assert plain is not None and plain.gpu is not None and plain.gpu.index == 1  # least loaded


@pytest.mark.parametrize(("gpus", "trials_per_gpu", "cores", "threads", "expected"), [
    (4, None, 16, None, "auto"),  # every GPU given, packed while its throughput rises
    (4, 1, 16, None, 4),      # ... or trials_per_gpu times each
    (2, 3, 16, None, 6),
    (2, "auto", 16, None, "auto"),
    (0, None, 8, None, 8),    # no GPU: one per core
    (0, None, 8, 3, 2),       # ... or per threads_per_trial cores
    (0, None, 2, 4, 1),       # never none
])
def test_parallel_unset_uses_what_the_run_was_given(
        gpus: int, trials_per_gpu: int | str | None, cores: int, threads: int | None,
        expected: int | str) -> None:
    parallel, why = resolve_parallel(None, gpus, trials_per_gpu, cores, threads)
    assert parallel == expected
    assert ("unset" in why) == (trials_per_gpu != "auto")
    assert ("throughput rises" in why) == (expected == "auto")


def test_parallel_given_is_kept_whatever_the_gpus() -> None:
    assert resolve_parallel(3, 8, None, 64, None) == (3, "scheduler.parallel=3")
    assert resolve_parallel("auto", 0, None, 64, None) == ("auto", "scheduler.parallel=auto")


@pytest.mark.parametrize(("cpu_slots", "gpu_places", "cores", "expected"), [
    ("auto", 2, 32, 2),   # 32 cores: 4 places of 8, 2 taken by the GPUs
    ("auto", 4, 64, 4),
    ("auto", 1, 16, 1),
    ("auto", 4, 16, 0),   # the GPU slots take every 8-core place
    ("auto", 0, 64, 0),   # no GPU: every slot is a CPU slot already
    (3, 2, 8, 3),
])
def test_cpu_slots_beside_the_gpus(cpu_slots: int | str, gpu_places: int, cores: int,
                                   expected: int) -> None:
    assert resolve_cpu_slots(cpu_slots, gpu_places, cores) == expected


def test_cpu_slots_run_beside_the_gpu_slots_after_them() -> None:
    gpus = FakeGpuBackend.from_spec("2").gpus()
    assert resolve_parallel(None, 2, None, 32, None, cpu_slots=2) == (
        "auto", "1 per GPU to start, more while throughput rises and 2 on CPU slots; "
                "scheduler.parallel unset")
    parallel, why = resolve_parallel(None, 2, 1, 32, None, cpu_slots=2)
    assert (parallel, why) == (4, "one trial per GPU given and 2 on CPU slots, scheduler.parallel unset")
    assert isinstance(parallel, int)
    pool = SlotPool.of(gpus, parallel, None, cpu_slots=2)
    assert pool.concurrency == 4 and threads_per_trial(None, pool.concurrency, 32) == 8
    taken = [pool.acquire() for _ in range(5)]
    assert taken[4] is None
    # the GPUs first, then the CPU slots, with an empty CUDA_VISIBLE_DEVICES
    assert [s.gpu.index if s and s.gpu else None for s in taken[:4]] == [0, 1, None, None]
    assert all(s is not None and s.cuda_visible_devices == "" for s in taken[2:4])
