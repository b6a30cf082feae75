"""Start-up overlap (placement/_rules.py, ``scheduler.startup_overlap``): while a GPU's first
trial starts up (no step reported, nothing ended) and the GPU reads idle, it takes one more
trial, as far as the ceiling, ``scheduler.parallel``, the host's cores and GPU memory allow;
once the trials that ran then are past their start-up, the level is kept where the host's cores
carry it (the first level taken from there where they left the GPU under ``target_util``), and
undone otherwise.

Issue 51: the CNN of workload (c) left an H200 at 0 % for the first 12-13 s of each cold
trial, then ran its ten epochs in 2.3 s, so its first steps (and the first level) came as it
ended, and the GPU ran one trial alone for 14 s."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hpo_orchestrator.placement._packer import StartUp, _together
from hpo_orchestrator.placement._rules import (
    STARTUP_LEVEL,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    TrialTime,
    decide,
)
from hpo_orchestrator.placement._view import RunningView

POLICY = PackingPolicy(target_util=80.0, max_per_gpu=4, startup_overlap=True)  # off by default
# one GPU, its first trial running; no trial's GPU memory known yet (no CUDA context)
HOST = HostObservation(cores=16, concurrency=1, cap=8, mem_peak_mib=None)
CNN = "batch_size=128/step"  # a kind measured per step


def _starting(**kw: Any) -> GpuObservation:
    """The first trial imports its modules: three readings at 0 %, a core of CPU."""
    base: dict[str, Any] = dict(gpu=0, running=1, util=0.0, readings=3, free_mib=140_000.0,
                                latest_util=(0.0, 0.0, 0.0), starting=True, cpu_cores=1.0)
    return GpuObservation(**{**base, **kw})


def _past_it(**kw: Any) -> GpuObservation:
    """Two trials past their start-up, stepping at 0.7 s a step, the GPU 60 % busy since."""
    base: dict[str, Any] = dict(gpu=0, running=2, util=20.0, readings=15, free_mib=130_000.0,
                                running_mem_mib=(1000.0, 1000.0),
                                trials=(TrialTime(CNN, 0.7, running=True, duration=14.0),),
                                cpu_cores=2.0, steady_util=60.0, steady_readings=2,
                                after_startup_util=60.0, after_startup_readings=3)
    return GpuObservation(**{**base, **kw})


def _state(**kw: Any) -> GpuLevel:
    return GpuLevel(**{"gpu": 0, "limit": 1, "since": 0.0, "ceiling": 4, **kw})


def _at_startup_level() -> GpuLevel:
    state, change = decide(POLICY, _state(), _starting(), HOST, now=4.0)
    assert change is not None and state.startup
    return state


def test_an_idle_gpu_whose_first_trial_is_starting_takes_a_second() -> None:
    state, change = decide(POLICY, _state(), _starting(), HOST, now=4.0)
    assert change is not None and (change.old, change.new) == (1, STARTUP_LEVEL) == (1, 2)
    assert "started during the first trial's start-up (GPU idle" in change.reason
    assert state.limit == 2 and state.since == 4.0 and state.startup


@pytest.mark.parametrize("obs", [
    _starting(latest_util=(0.0, 40.0, 0.0)),  # the trial already works the GPU
    _starting(latest_util=(0.0, 0.0), readings=2),  # too few readings to call it idle
    _starting(starting=False),  # a trial reported a step (or ended): the start-up is over
    _starting(running=0),  # nothing runs: the place is not even busy
])
def test_no_second_trial_unless_the_first_is_starting_on_an_idle_gpu(obs: GpuObservation) -> None:
    state, change = decide(POLICY, _state(), obs, HOST, now=4.0)
    assert change is None and state.limit == 1 and not state.startup


def test_switched_off_the_first_trial_starts_up_alone() -> None:
    """scheduler.startup_overlap=false."""
    state, change = decide(replace(POLICY, startup_overlap=False), _state(), _starting(), HOST, 4.0)
    assert change is None and state.limit == 1


def test_once_a_trial_reported_steps_the_first_level_decides_as_before() -> None:
    """Past the start-up, the usual rules: the steady 23 % goes to three per GPU at once."""
    obs = _starting(starting=False, latest_util=(23.0,) * 3, steady_util=23.0,
                    steady_readings=4, running_mem_mib=(1000.0,),
                    trials=(TrialTime(CNN, 0.7, running=True, duration=14.0),))
    state, change = decide(POLICY, _state(), obs, replace(HOST, mem_peak_mib=1000.0), now=14.0)
    assert change is not None and change.new == 3 and not state.startup
    assert change.reason.startswith("23% utilization at 1 per GPU: 3 per GPU")


@pytest.mark.parametrize(("obs", "host", "policy", "held"), [
    # its imports take 14 of 16 cores: 85 % of them carry no second such trial
    (_starting(cpu_cores=14.0), HOST, POLICY, "host CPU"),
    # no CPU readings yet: a trial per core, and the host has one
    (_starting(cpu_cores=None), replace(HOST, cores=1), POLICY, "no CPU core"),
    # a trial's peak (2000 MiB) is known: x 1.25 + 512 does not fit beside the first one's growth
    (_starting(free_mib=3000.0, running_mem_mib=(500.0,)), replace(HOST, mem_peak_mib=2000.0),
     POLICY, "GPU memory"),
    (_starting(), replace(HOST, cap=1), POLICY, "at scheduler.parallel=1"),
    # two GPUs judged together, a trial each: scheduler.parallel=2 is reached
    (_starting(), replace(HOST, concurrency=2, cap=2, adds=2), POLICY, "at scheduler.parallel=2"),
    (_starting(), HOST, replace(POLICY, max_per_gpu=1), "scheduler.max_trials_per_gpu=1"),
])
def test_the_start_up_trial_stays_within_the_usual_bounds(obs: GpuObservation,
                                                          host: HostObservation,
                                                          policy: PackingPolicy, held: str) -> None:
    state, change = decide(policy, _state(ceiling=policy.max_per_gpu), obs, host, now=4.0)
    assert change is None and state.limit == 1 and not state.startup
    assert state.held is not None and held in state.held, state.held


def test_one_trial_at_most_while_the_start_up_lasts() -> None:
    """Both trials still starting and the GPU still idle: no third (four heavy trials started
    at once would share the GPU's time and memory before anything was known of them)."""
    state = _at_startup_level()
    state, change = decide(POLICY, state, _starting(running=2), replace(HOST, concurrency=2),
                           now=8.0)
    assert change is None and state.limit == 2 and state.startup
    assert state.held_by == "measuring"
    assert "since the first trial's start-up (GPU idle): waiting for its trials' first steps" in (
        state.held or "")


def test_two_trials_under_target_after_the_start_up_keep_the_level() -> None:
    """60 % at two (30 % a trial: 80 / 30 is two): kept. The kept level is measured on its
    own trials, then climbed from as usual, and the level above is judged against it."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(), host, now=20.0)
    assert change is None and state.limit == 2 and not state.startup
    assert "kept: 60% utilization after it" in (state.held or "")
    state, change = decide(POLICY, state, _past_it(), host, now=21.0)
    assert change is None and "measuring trial durations at 2 per GPU (0 of 2)" in (state.held or "")
    measured = (TrialTime(CNN, 0.7, duration=2.3), TrialTime(CNN, 0.75, duration=2.4))
    state, change = decide(POLICY, state, _past_it(trials=measured), host, now=24.0)
    assert change is not None and (change.old, change.new) == (2, 3)
    # three per GPU at 2.3 s a step: 0.9x the steps per minute of two: no gain, back to two
    slow = tuple(TrialTime(CNN, 2.3, duration=20.0) for _ in range(4))
    state, change = decide(POLICY, state, _past_it(running=3, trials=slow),
                           replace(host, concurrency=3), now=40.0)
    assert change is not None and (change.old, change.new) == (3, 2) and "no gain" in change.reason


def test_two_trials_far_under_target_go_on_to_the_first_level_from_there() -> None:
    """20 % at two, 10 % a trial: 80 / 10 would be eight, four at most; judged against two's
    seconds per step."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(after_startup_util=20.0),
                           host, now=20.0)
    assert change is not None and (change.old, change.new) == (2, 4)
    assert change.reason.startswith("20% utilization at 2 per GPU: 4 per GPU (bound by "
                                    "scheduler.max_trials_per_gpu; 80% / 10% a trial would be 8)")
    assert state.times[2] == {CNN: (0.7,)} and not state.startup


def test_the_first_level_from_there_waits_for_a_trial_to_time_the_kept_one() -> None:
    """The level above is judged against this one: no trial timed yet (each ran beside a
    starting one), no jump; the first that does sets it off."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(after_startup_util=20.0, trials=()),
                           host, now=20.0)
    assert change is None and state.limit == 2 and state.startup
    assert "kept: 20% utilization after it, under 80%; 4 per GPU once a trial timed 2 per GPU" in (
        state.held or "")
    state, change = decide(POLICY, state, _past_it(after_startup_util=20.0), host, now=21.0)
    assert change is not None and (change.old, change.new) == (2, 4)


def test_two_trials_at_target_after_the_start_up_keep_the_level_and_hold_there() -> None:
    """90 % at two: they may share the GPU's time, which loses nothing against one alone
    (workload c: going back to one cost half the trials, one alone reading 20-40 %). Kept,
    held at the target; the level above is judged against two's own trials once the GPU
    reads under the target again."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    busy = _past_it(after_startup_util=90.0, util=90.0, steady_util=90.0)
    state, change = decide(POLICY, _at_startup_level(), busy, host, now=20.0)
    assert change is None and state.limit == 2 and not state.startup
    assert "kept: 90% utilization after it, at or over 80%" in (state.held or "")
    measured = (TrialTime(CNN, 0.7, duration=2.3), TrialTime(CNN, 0.75, duration=2.4))
    state, change = decide(POLICY, state, replace(busy, trials=measured), host, now=24.0)
    assert change is None and state.limit == 2
    state, change = decide(POLICY, state, _past_it(trials=measured), host, now=30.0)
    assert change is not None and (change.old, change.new) == (2, 3)


def test_a_start_up_level_the_host_cannot_carry_goes_back_to_one() -> None:
    """Each trial uses 7 of 16 cores once trained: 85 % of them carry one, not two."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(cpu_cores=14.0), host, now=20.0)
    assert change is not None and (change.old, change.new) == (2, 1)
    assert "host CPU: 16 cores (14.0 used) carry 1 such trials, not 2" in change.reason
    assert "back to 1 per GPU" in change.reason
    assert state.limit == 1 and not state.startup and state.ceiling == 4  # no loss counted
    # the start-up is not taken again: level 1 climbs as usual, on trials measured at it
    again, change = decide(POLICY, state, _starting(starting=True), HOST, now=21.0)
    assert change is None and again.limit == 1


def test_an_oom_at_the_start_up_level_backs_off_for_good() -> None:
    state, change = decide(POLICY, _at_startup_level(), _starting(running=2, ooms=1),
                           replace(HOST, concurrency=2), now=9.0)
    assert change is not None and (change.old, change.new) == (2, 1)
    assert state.ceiling == 1 and not state.startup


# --- what the packer observes ----------------------------------------------------------------


def _view(worker: int, started: float, reports: tuple[tuple[int, float], ...] = ()) -> RunningView:
    return RunningView(gpu=0, worker=worker, started=started, reports=reports)


def test_a_start_up_ends_at_a_first_step_and_is_over_once_each_of_its_trials_stepped() -> None:
    startup = StartUp()
    first, second = _view(1, 1.0), _view(2, 5.0)
    startup.see(first, now=2.0)
    startup.see(second, now=6.0)
    assert startup.starting and startup.over_at() is None
    startup.see(_view(1, 1.0, reports=((1, 13.0),)), now=14.5)  # first step at 14 s
    assert not startup.starting and startup.over_at() is None  # the second still starts
    startup.see(_view(3, 16.0), now=16.5)  # started after the start-up ended: not one of it
    startup.see(_view(2, 5.0, reports=((1, 12.5),)), now=18.0)
    assert startup.over_at() == 17.5


def test_a_start_up_trial_that_ends_or_goes_without_a_step_is_past_it() -> None:
    """Trials that report nothing: their end ends the start-up; a lost one is past it when it
    is gone, so the level taken then does not wait for it for good."""
    startup = StartUp()
    startup.see(_view(1, 1.0), now=2.0)
    startup.see(_view(2, 5.0), now=6.0)
    startup.see(_view(1, 1.0), now=20.0, ended=True)
    assert not startup.starting and startup.over_at() is None
    startup.gone({(3, 21.0)}, now=22.0)
    assert startup.over_at() == 22.0


def test_a_group_starts_while_every_gpu_does_and_reads_its_busiest() -> None:
    a = _starting(latest_util=(0.0, 3.0, 0.0), after_startup_util=None)
    b = _starting(gpu=1, latest_util=(9.0, 0.0), starting=False)
    both = _together([a, b])
    assert both.latest_util == (9.0, 0.0) and not both.starting
    known = _together([replace(a, after_startup_util=10.0, after_startup_readings=4),
                       replace(b, after_startup_util=30.0, after_startup_readings=3)])
    assert (known.after_startup_util, known.after_startup_readings) == (20.0, 3)
    assert _together([a, replace(b, after_startup_util=30.0)]).after_startup_util is None


def test_the_first_trial_leaves_the_start_up_trial_its_share_of_the_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """16 cores, one GPU: its first trial gets 8 threads, not 16, while the GPU may still take
    a start-up trial, so that trial's 8 are free whatever the first does once trained
    (LightGBM keeps all its threads busy: 16 + 8 on 16 cores ran 30x slower). Once the
    start-up is over (a first step), the share is the cores over the trials at once again."""
    from hpo_orchestrator.gpu import GpuInfo
    from hpo_orchestrator.placement import _packer
    from tests.placement.test_packer import packer_of

    monkeypatch.setattr(_packer, "detect_mps", lambda: {"active": False})
    gpus = [GpuInfo(index=0, uuid="GPU-0", name="fake", memory_total_mib=80_000)]
    packer = packer_of(gpus, ["scheduler.host_cores=16", "scheduler.startup_overlap=true"], None)
    assert packer.threads_for_next(()) == 8
    off = packer_of(gpus, ["scheduler.host_cores=16"], None)  # the default: off
    assert off.threads_for_next(()) == 16
    packer.trial_ended(_view(1, 1.0, reports=((1, 13.0),)), None, 1000.0)
    assert packer.threads_for_next(()) == 16


# --- the verdict at its edges (mutmut's survivors of _startup_verdict, docs/MUTATION.md) ------

def test_the_verdict_waits_for_its_readings_even_with_a_mean_of_them() -> None:
    """A mean of one reading since the start-up is not min_readings of them: held, waiting."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(after_startup_readings=1), host,
                           now=20.0)
    assert change is None and state.startup and state.held_by == "measuring"
    assert "waiting for its trials' first steps" in (state.held or "")


def test_a_kept_level_is_held_as_measuring_until_it_moves() -> None:
    """Kept without a jump (60 % at two: two it is) or before a trial timed it: "measuring",
    the hold status reads as the level's measuring, not as a reason to stay."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    kept, change = decide(POLICY, _at_startup_level(), _past_it(), host, now=20.0)
    assert change is None and kept.held_by == "measuring"
    untimed, change = decide(POLICY, _at_startup_level(), _past_it(after_startup_util=20.0, trials=()),
                             host, now=20.0)
    assert change is None and untimed.held_by == "measuring"


def test_the_target_itself_counts_as_at_or_over_it() -> None:
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, _ = decide(POLICY, _at_startup_level(), _past_it(after_startup_util=80.0), host, now=20.0)
    assert "kept: 80% utilization after it, at or over 80%" in (state.held or "")


def test_cores_that_carry_exactly_the_trials_keep_them() -> None:
    """6 cores a trial of 16 (85 % of them carry two): two is what they carry, kept."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(cpu_cores=12.0), host, now=20.0)
    assert change is None and state.limit == 2


def test_cores_unmeasured_undo_it_by_one_trial_per_core() -> None:
    """No CPU readings: one trial per core, and a host of one core carries one."""
    host = replace(HOST, cores=1, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(cpu_cores=None), host, now=20.0)
    assert change is not None and (change.old, change.new) == (2, 1)
    assert change.reason.startswith("host CPU: 1 cores (use not measured) carry 1 such trials, not 2")
    assert state.since == 20.0  # the level's clock starts at the verdict


def test_the_first_level_from_there_starts_its_clock_at_the_verdict() -> None:
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(POLICY, _at_startup_level(), _past_it(after_startup_util=20.0), host,
                           now=20.0)
    assert change is not None and (change.old, change.new) == (2, 4) and state.since == 20.0


def test_a_start_up_trial_that_ended_before_the_verdict_times_the_kept_level() -> None:
    """Its seconds per step at two are the base the first level is judged on, as a running
    trial's would be: no wait for another trial to time two."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    ended = (TrialTime(CNN, 0.7, duration=2.3),)
    state, change = decide(POLICY, _at_startup_level(), _past_it(after_startup_util=20.0, trials=ended),
                           host, now=20.0)
    assert change is not None and (change.old, change.new) == (2, 4)
    assert state.times[2] == {CNN: (0.7,)}


def test_fill_takes_the_level_two_trials_point_to_rounded_up() -> None:
    """60 % at two (30 % a trial): under keeps two and waits for a trial timed there; fill
    goes on to three, judged against two (gpu-o57: two read 49-68 %, and the climb to three
    waited 27-40 s)."""
    host = replace(HOST, concurrency=2, mem_peak_mib=1000.0)
    state, change = decide(replace(POLICY, first_level="fill"), _at_startup_level(), _past_it(),
                           host, now=20.0)
    assert change is not None and (change.old, change.new) == (2, 3)
    assert "80% / 30% a trial would be 3, rounded up" in change.reason
    assert state.times[2] == {CNN: (0.7,)} and not state.startup
