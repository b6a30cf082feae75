"""The host's cores as packing counts them (placement/_rules.py ``cpu_room``, ``CoreRoom``):
from what the running trials were measured to use, not from how many there are or the
threads they were given; one trial per core while nothing is measured yet (issue 51.1)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hpo_orchestrator.placement._rules import (
    CoreRoom,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    TrialTime,
    cpu_room,
    decide,
    step,
)

POLICY = PackingPolicy(target_util=80.0, max_per_gpu=4)
# The 2-core machine of issue 51: 2 GPUs of different models (each its own group, adds=1),
# one trial on each so far.
TWO_CORES = HostObservation(cores=2, concurrency=2, cap=8, mem_peak_mib=1024.0, adds=1, running=2)
STEP = "*/step"


def _obs(**kw: Any) -> GpuObservation:
    """A GPU 25 % busy with one trial past its set-up (two steps timed), memory to spare."""
    base: dict[str, Any] = dict(gpu=0, running=1, util=25.0, readings=6, free_mib=80_000.0,
                                running_mem_mib=(1024.0,),
                                trials=(TrialTime(STEP, 0.4, running=True, duration=1.5),),
                                ooms=0, cpu_cores=0.06, steady_util=25.0, steady_readings=4)
    return GpuObservation(**{**base, **kw})


def _state(**kw: Any) -> GpuLevel:
    return GpuLevel(**{"gpu": 0, "limit": 1, "since": 0.0, "ceiling": 4, **kw})


@pytest.mark.parametrize(("host", "used", "carried", "by"), [
    (TWO_CORES, None, 2, "CPU cores"),  # nothing measured: a trial per core
    (TWO_CORES, 0.06, 56, "host CPU"),  # 0.03 a trial: 85 % of 2 cores carries 56
    (TWO_CORES, 0.0, None, "host CPU"),  # no use at all: no bound from the CPU
    # LightGBM at 16 threads on 16 cores, measured at 15: not even the one running fits
    (HostObservation(cores=16, concurrency=1, cap=8, mem_peak_mib=None, running=1), 15.0, 0,
     "host CPU"),
    # the mean is over the trials running, not over the places: 2 running of 4 places use 4
    (HostObservation(cores=16, concurrency=4, cap=8, mem_peak_mib=None, running=2), 4.0, 6,
     "host CPU"),
    (HostObservation(cores=16, concurrency=4, cap=8, mem_peak_mib=None), 4.0, 13, "host CPU"),
])
def test_the_cores_carry_trials_by_their_measured_use(host: HostObservation, used: float | None,
                                                      carried: int | None, by: str) -> None:
    assert cpu_room(POLICY, host, used) == (carried, by)


def test_two_cores_two_gpus_a_quarter_busy_go_to_their_first_level() -> None:
    """Issue 51: trials that use almost no CPU (0.06 cores for two) on 2 cores leave room:
    the GPU goes to 80 / 25 = 3 per GPU from its first steps. Before, a trial per core held
    it at one ("no CPU core for 1 more trial")."""
    state, change = decide(POLICY, _state(), _obs(), TWO_CORES, now=3.0)
    assert change is not None and (change.old, change.new) == (1, 3), state.held
    assert "(bound by utilization;" in change.reason


def test_without_cpu_readings_a_trial_per_core_still_holds() -> None:
    """The safe rule while the sampler has no full round yet: 2 trials on 2 cores."""
    state, change = decide(POLICY, _state(), _obs(cpu_cores=None), TWO_CORES, now=3.0)
    assert change is None and state.limit == 1 and state.held_by == "cpu"
    assert (state.held or "").startswith("no CPU core for 1 more trial(s) (2 cores, 2 trials; "
                                         "their CPU use not measured yet)")


@pytest.mark.parametrize(("used", "level"), [(0.06, 3), (1.6, 1), (1.0, 2)])
def test_the_first_level_stops_where_the_measured_use_fills_the_cores(used: float,
                                                                      level: int) -> None:
    """Two running trials using ``used`` cores together on 2 cores: 85 % of them carries
    1.7 / (used / 2) trials at once, the two GPUs' first trials included."""
    _, change = decide(POLICY, _state(), _obs(cpu_cores=used), TWO_CORES, now=3.0)
    assert (1 if change is None else change.new) == level
    if level == 2:
        assert change is not None and "(bound by host CPU;" in change.reason


def test_a_later_raise_is_held_by_the_measured_use() -> None:
    """At two per GPU, trials measured at 0.8 cores each on 2 cores: a third would pass
    85 % of them; the same trials measured at 0.1 leave room."""
    times = {1: {STEP: (0.4, 0.4)}}
    state = _state(limit=2, times=times)
    trials = (TrialTime(STEP, 0.5, duration=6.0),) * 2  # 1.6x the steps/min of one
    host = replace(TWO_CORES, concurrency=3, running=3)
    held, change = decide(POLICY, state, _obs(running=2, trials=trials, cpu_cores=2.4), host, 9.0)
    assert change is None and held.held_by == "cpu"
    assert (held.held or "").startswith("host CPU: the running trials use 2.4 of 2 cores")
    _, change = decide(POLICY, state, _obs(running=2, trials=trials, cpu_cores=0.3), host, 9.0)
    assert change is not None and (change.old, change.new) == (2, 3)


@pytest.mark.parametrize(("held", "used", "free", "enough"), [
    (16, None, 0.0, False),  # threads given, nothing measured: the old rule
    (16, 2.0, 14.0, True),  # a GPU trial given 16 threads uses 2: room for the new 8
    (16, 15.0, 1.0, False),  # LightGBM at 16 threads uses them: it waits
    (0, 3.0, 16.0, True),  # readings of a trial that ended: nothing holds the cores now
])
def test_a_raise_waits_for_the_cores_the_trials_use(held: int, used: float | None, free: float,
                                                    enough: bool) -> None:
    room = CoreRoom(cores=16, held=held, at_once=1, cap=8, waiting=1, used=used)
    assert (room.free(), room.enough()) == (free, enough)


def test_on_two_cores_the_raise_is_made_at_once_when_the_trials_use_little() -> None:
    """Each of the two trials was given a core (2 of 2 held): counted by threads the raise
    waited for a trial's end; measured at 0.06 cores it is made now."""
    def room(used: float | None) -> CoreRoom:
        return CoreRoom(cores=2, held=2, at_once=2, cap=8, waiting=1, used=used)

    made = step(POLICY, _state(), None, _obs(), TWO_CORES, room(0.06), now=3.0)
    assert made.change is not None and made.state.limit == 3 and made.waiting is None
    waits = step(POLICY, _state(), None, _obs(), TWO_CORES, room(None), now=3.0)
    assert waits.change is None and waits.waiting is not None
