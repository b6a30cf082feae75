"""The packer's side of the start-up overlap (placement/_packer.py, ``StartUp``, ``observation``,
``_together``), from their docstrings, for the mutants mutmut found unguarded
(docs/MUTATION.md, "mutmut"): a GPU's start-up lasts until a trial on it reports a step or
ends, or is gone without either; the trials of it are those that started before it ended,
each past at its first step; the GPU's observation says whether it is starting and gives its
utilization since every trial of the start-up was past its own; a group starts while every
GPU does. The rule that judges a level taken then is tested in test_rules_startup.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement import RunningView, _packer
from hpo_orchestrator.placement._packer import StartUp, _together
from hpo_orchestrator.telemetry._sampler import DeviceReading
from tests.placement.test_packer import _Clock, _obs, packer_of

OVERLAP = ["scheduler.parallel=auto", "scheduler.host_cores=16", "scheduler.startup_overlap=true"]
TOTAL_MIB = 80_000.0


def _view(worker: int, started: float, reports: tuple[tuple[int, float], ...] = (),
          gpu: int = 0) -> RunningView:
    return RunningView(gpu=gpu, worker=worker, started=started, threads=8,
                       params={"kind": "lightgbm"}, choices={"kind": 2}, reports=reports)


# --- StartUp -------------------------------------------------------------------------------

def test_the_start_up_ends_at_the_earliest_first_step_and_holds_the_trials_started_before() -> None:
    """Two trials of the start-up step at 14 s and 17.5 s, told in that order: it ended at 14;
    a trial started at 16 is none of it, and one started exactly at 14 is not either ("started
    before then")."""
    startup = StartUp()
    startup.see(_view(1, 1.0), now=2.0)
    startup.see(_view(2, 5.0), now=6.0)
    startup.see(_view(1, 1.0, reports=((1, 13.0),)), now=14.5)
    startup.see(_view(2, 5.0, reports=((1, 12.5),)), now=18.0)
    startup.see(_view(3, 16.0), now=18.5)
    startup.see(_view(4, 14.0), now=18.5)
    assert startup.ended_at == 14.0 and startup.over_at() == 17.5


def test_a_start_up_trial_still_running_without_a_step_is_not_past_it() -> None:
    startup = StartUp()
    startup.see(_view(1, 1.0), now=2.0)
    startup.gone({(1, 1.0)}, now=3.0)
    assert startup.starting and startup.over_at() is None


def test_a_lone_start_up_trial_gone_without_a_step_ends_it_then() -> None:
    """A lost worker: its trial never stepped nor ended; gone at 22 s, it is past then."""
    startup = StartUp()
    startup.see(_view(1, 1.0), now=2.0)
    startup.gone(set(), now=22.0)
    assert not startup.starting and startup.ended_at == 22.0 and startup.over_at() == 22.0


def test_a_trial_gone_after_the_start_up_ended_leaves_its_end() -> None:
    """The start-up ended at the first trial's step (14 s); the second, gone at 22 s, is past
    then, and the start-up's end stays at 14 (the trials of it are those started before)."""
    startup = StartUp()
    startup.see(_view(1, 1.0), now=2.0)
    startup.see(_view(2, 5.0), now=6.0)
    startup.see(_view(1, 1.0, reports=((1, 13.0),)), now=14.5)
    startup.gone({(1, 1.0)}, now=22.0)
    assert startup.ended_at == 14.0 and startup.over_at() == 22.0


def test_a_group_is_starting_while_every_gpu_is() -> None:
    starting = _obs(starting=True)
    assert _together([starting, replace(starting, gpu=1)]).starting is True
    assert _together([starting, replace(starting, gpu=1, starting=False)]).starting is False


# --- the packer ------------------------------------------------------------------------------

class _Sampler:
    """The telemetry sampler: the readings given, per GPU, those since ``since``."""

    def __init__(self) -> None:
        self.readings: dict[int, list[DeviceReading]] = {0: []}

    def add(self, gpu: int, t: float, util: float | None) -> None:
        self.readings.setdefault(gpu, []).append(DeviceReading(t, util, 10_000.0))

    def device_readings(self, gpu_index: int, since: float) -> list[DeviceReading]:
        return [r for r in self.readings.get(gpu_index, []) if r.t >= since]

    def cpu_readings(self, since: float) -> list[float]:
        return [2.0] * 5

    def running_mem_peaks(self, gpu_index: int) -> list[float]:
        return []


@pytest.fixture(autouse=True)
def _no_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_packer, "detect_mps", lambda: {"active": False})


def _packer_on_one_gpu(sampler: _Sampler) -> Any:
    return packer_of([GpuInfo(index=0, uuid="GPU-0", name="fake", memory_total_mib=TOTAL_MIB)],
                     OVERLAP, sampler)


def test_the_gpus_observation_is_starting_then_reads_the_gpu_after_the_start_up(
        clock: _Clock) -> None:
    """While its first trial starts the GPU is "starting" (idle readings, none after the
    start-up yet); once that trial reported its first step (10 s after its spawn), the
    observation's utilization after the start-up is that of the readings since then alone,
    and the latest readings are the newest ``min_readings``."""
    sampler = _Sampler()
    packer = _packer_on_one_gpu(sampler)
    start = clock.now
    first = _view(1, start)
    packer.pool.acquire()
    for k in (1, 2, 3):
        sampler.add(0, start + k, 0.0)
    clock.now = start + 4.0
    packer.tick([first])
    seen = packer._seen[0]
    assert seen.gpu == 0 and seen.starting is True
    assert (seen.after_startup_util, seen.after_startup_readings) == (None, 0)
    for k, util in ((11, 40.0), (12, None), (13, 50.0), (14, 60.0), (15, 70.0)):
        sampler.add(0, start + k, util)
    clock.now = start + 16.0
    packer.tick([_view(1, start, reports=((1, 10.0),))])
    seen = packer._seen[0]
    assert seen.starting is False
    assert (seen.after_startup_util, seen.after_startup_readings) == (55.0, 4)
    assert seen.latest_util == (50.0, 60.0, 70.0)


def test_a_start_up_trial_lost_without_a_step_ends_the_start_up_when_gone(clock: _Clock) -> None:
    sampler = _Sampler()
    packer = _packer_on_one_gpu(sampler)
    packer.pool.acquire()
    clock.now += 2.0
    packer.tick([_view(1, clock.now - 1.0)])
    assert packer._seen[0].starting is True
    clock.now += 2.0
    packer.tick([])  # the worker is gone, its trial never told as ended
    assert packer._seen[0].starting is False


def test_a_start_up_trial_that_ends_without_a_step_ends_the_start_up(clock: _Clock) -> None:
    """The place the overlap may open counts while the GPU's first trial starts (8 threads of
    16 for the first); a first trial that ends without a step ends that start-up: 16 again."""
    packer = _packer_on_one_gpu(_Sampler())
    assert packer.threads_for_next(()) == 8
    packer.trial_ended(_view(1, clock.now), None, 1000.0)
    assert packer.threads_for_next(()) == 16


def test_a_trial_on_a_gpu_the_packer_does_not_place_is_not_its_business(clock: _Clock) -> None:
    packer = _packer_on_one_gpu(_Sampler())
    packer.trial_ended(_view(1, clock.now, gpu=5), "oom", 1000.0)
    assert packer.threads_for_next(()) == 8 and packer.levels[0].limit == 1
