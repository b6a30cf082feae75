"""trials_per_gpu=auto on several GPUs of one model: judged together (placement/_packer.py).

Run K on two H100s (docs/BENCHMARKS.md, issue 17): judged apart, the two GPUs of one study
decided differently, one GPU's climb slowing the other's trials through the shared cores.
Together, a level rests on the trials of both and both move at once."""

from __future__ import annotations

from typing import Any

import pytest

from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement._packer import Packer, gpu_groups
from hpo_orchestrator.placement._rules import GpuLevel
from hpo_orchestrator.placement._slots import SlotPool
from tests.placement.test_packer import _Clock, _Readings, _rt, packer_of


class _Scripted(_Readings):
    """A GPU at 20 %; ``used`` MiB of 80 GB taken on each GPU (70 GB free by default)."""

    def __init__(self, used: dict[int, float] | None = None) -> None:
        super().__init__(cpu=2.0)
        self.used = used or {}

    def device_readings(self, gpu_index: int, since: float) -> list[Any]:
        from hpo_orchestrator.telemetry._sampler import DeviceReading

        return [DeviceReading(since, 20.0, self.used.get(gpu_index, 10_000.0))] * 5


def _gpus(*names: str) -> list[GpuInfo]:
    return [GpuInfo(index=i, uuid=f"GPU-{i}", name=name, memory_total_mib=80_000)
            for i, name in enumerate(names)]


def _packer(readings: _Scripted, *names: str) -> Packer:
    return packer_of(_gpus(*names), ["scheduler.parallel=auto", "scheduler.host_cores=16",
                                     "scheduler.threads_per_trial=2"], readings)


def _end(packer: Packer, clock: _Clock, gpu: int, seconds: float, pid: int,
         fail: str | None = None) -> None:
    slot = next(s for s in packer.pool.slots if s.gpu is not None and s.gpu.index == gpu)
    rt = _rt(slot, 2, clock.now, pid)
    clock.now += seconds
    packer.trial_ended(rt, fail, 1000.0)


def _fill(packer: Packer) -> None:
    while packer.pool.acquire() is not None:
        pass


def test_gpus_of_one_model_and_size_are_one_group() -> None:
    pool = SlotPool.of(_gpus("H100", "H100", "A100"), "auto", None, max_per_gpu=4)
    assert gpu_groups(pool) == {0: (0, 1), 2: (2,)}


def test_two_gpus_climb_together_on_the_trials_of_both(clock: _Clock) -> None:
    """Level 1 needs two measured trials: one on each GPU (after each worker's warm-up) is
    enough together, where apart each GPU would wait for its second. Both go to 2 at once,
    and each GPU's change is recorded."""
    packer = _packer(_Scripted(), "H100", "H100")
    _fill(packer)
    _end(packer, clock, 0, 30.0, pid=1)  # warm-ups
    _end(packer, clock, 1, 30.0, pid=2)
    _end(packer, clock, 0, 10.0, pid=1)
    assert packer.tick([]) is False and "(1 of 2)" in (packer.levels[1].held or "")
    _end(packer, clock, 1, 10.0, pid=2)
    assert packer.tick([]) is True
    assert packer.pool.limits == {0: 2, 1: 2}
    changes = packer.study.user_attrs["hpo.packing.h"]["changes"]
    assert [(c["gpu"], c["from"], c["to"]) for c in changes] == [(0, 1, 2), (1, 1, 2)]


@pytest.mark.parametrize("gpu", [0, 1])
def test_an_oom_on_either_gpu_backs_both_off(clock: _Clock, gpu: int) -> None:
    packer = _packer(_Scripted(), "H100", "H100")
    for index in (0, 1):
        packer.pool.set_limit(index, 2)
    packer.levels = {i: GpuLevel(gpu=i, limit=2, since=clock.now, ceiling=4) for i in (0, 1)}
    _fill(packer)
    _end(packer, clock, gpu, 5.0, pid=3, fail="oom")
    assert packer.pool.limits == {0: 1, 1: 1}
    assert all("out of GPU memory at 2 per GPU" in c["reason"]
               for c in packer.study.user_attrs["hpo.packing.h"]["changes"])


def test_the_gpu_with_the_least_free_memory_holds_the_group(clock: _Clock) -> None:
    packer = _packer(_Scripted(used={1: 79_500.0}), "H100", "H100")
    _fill(packer)
    for gpu, pid, seconds in ((0, 1, 30.0), (1, 2, 30.0), (0, 1, 10.0), (1, 2, 10.0)):
        _end(packer, clock, gpu, seconds, pid)
    assert packer.tick([]) is False and packer.pool.limits == {0: 1, 1: 1}
    assert "GPU memory: 500 MiB free" in (packer.levels[0].held or "")


def test_gpus_of_different_models_are_judged_apart(clock: _Clock) -> None:
    packer = _packer(_Scripted(), "H100", "A100")
    _fill(packer)
    for seconds in (30.0, 10.0, 10.0):
        _end(packer, clock, 0, seconds, pid=1)
    assert packer.tick([]) is True and packer.pool.limits == {0: 2, 1: 1}


def test_a_group_sees_its_steady_utilization_once_every_gpu_has_one() -> None:
    """The first level reads the steady utilization (after the trials' set-up): a group of
    two H200s must carry it, or the jump never happens on a host of identical GPUs (it did
    not on 2 x H200: 1 -> 2 after 40 s by the slow climb, where 12 % asked for 4)."""
    from hpo_orchestrator.placement._packer import _together
    from hpo_orchestrator.placement._rules import GpuObservation

    def seen(gpu: int, steady: float | None, readings: int) -> GpuObservation:
        return GpuObservation(gpu=gpu, running=1, util=30.0, readings=9, free_mib=70_000.0,
                              steady_util=steady, steady_readings=readings)

    both = _together([seen(0, 10.0, 5), seen(1, 20.0, 3)])
    assert (both.steady_util, both.steady_readings) == (15.0, 3)
    one_still_setting_up = _together([seen(0, 10.0, 5), seen(1, None, 0)])
    assert (one_still_setting_up.steady_util, one_still_setting_up.steady_readings) == (None, 0)
