"""The packing rules (placement/_rules.py) at the edges of their promises: each bound met
exactly, what holds a GPU in a word (``held_by``, which the low_gpu_util finding's advice
reads) as well as in words, what a verdict leaves in the state for the next one (the counted
loss, the time of the change, the rates and gains shown), and the durations that say nothing
(a duration of no time, a running trial not yet past break-even). Written from the module's
docstrings for the mutants mutmut found unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpo_orchestrator.placement._rules import (
    FAR_LOSS,
    HOLD_CAUSES,
    REPROBE_TRIALS,
    CoreRoom,
    GpuLevel,
    GpuObservation,
    HostObservation,
    TrialTime,
    _Gain,
    decide,
    may_rise,
    memory_room,
    start_from,
    step,
)
from tests.placement.test_packer import HOST, LGBM, POLICY, _obs, _state, _t

PER_STEP = "kind=lightgbm/step"  # a kind judged by seconds per step


def _measured_at_two(*trials: TrialTime, base: tuple[float, ...] = (10.0, 10.0),
                     **obs: object) -> tuple[GpuLevel, object]:
    """decide() at two per GPU, level 1 measured at ``base`` seconds."""
    state = _state(limit=2, times={1: {LGBM: base}})
    return decide(POLICY, state, _obs(**{"running": 2, "trials": trials, **obs}), HOST, 1.0)


# --- what holds a GPU, in a word and in words ----------------------------------------------

# One trial at two per GPU, 10 s alone: two trials of 18 s gained 1.11x (under climb_gain).
SMALL_GAIN = (_state(limit=2, times={1: {LGBM: (10.0, 10.0)}}),
              _obs(running=2, trials=(_t(18.0), _t(18.0))))
# Per step: 1.8 s a step against 1 s alone, the trials/min of whole trials not compared.
SMALL_GAIN_PER_STEP = (_state(limit=2, times={1: {PER_STEP: (1.0, 1.0)}}),
                       _obs(running=2, trials=(TrialTime(PER_STEP, 1.8, duration=30.0),) * 2))
# Three per GPU gained 1.20x after two's 1.60x: four would gain 1.44 / 1.6 = 0.90x.
SHRINKING = (_state(limit=3, times={2: {LGBM: (5.5, 5.5)}}, gains={2: 1.6}),
             _obs(running=3, trials=(_t(6.875), _t(6.875))))
MEMORY_HELD = "GPU memory: 2000 MiB free, a trial needs 3012 MiB (peak 2000 MiB x 1.25 + 512)"


@pytest.mark.parametrize(("state", "obs", "host", "held_by", "held"), [
    (_state(), _obs(), replace(HOST, cap=1), "parallel", "at scheduler.parallel=1 trials on this host"),
    (_state(), _obs(running=0), HOST, "idle", "0 of its 1 places busy"),
    # a place idles while the last real reason still holds: that reason, in its word too
    (_state(held=MEMORY_HELD, held_by="memory"), _obs(running=0), HOST, "memory", MEMORY_HELD),
    (_state(), _obs(readings=1), HOST, "measuring", "measuring utilization"),
    (_state(), _obs(util=95.0), HOST, "busy", "95% utilization >= scheduler.target_gpu_util=80"),
    (_state(), _obs(), replace(HOST, mem_peak_mib=None), "measuring", "GPU memory unknown"),
    (_state(), _obs(free_mib=2500.0), HOST, "memory", MEMORY_HELD),
    (_state(), _obs(trials=(_t(10.0),)), HOST, "measuring",
     "measuring trial durations at 1 per GPU (1 of 2)"),
    (*SMALL_GAIN, HOST, "no_gain",
     "2 per GPU finished 1.11x the trials/min of 1 per GPU, under the 1.15x that pays for one more"),
    (*SMALL_GAIN_PER_STEP, HOST, "no_gain",
     "2 per GPU ran 1.11x the steps/min of 1 per GPU, under the 1.15x that pays for one more"),
    (*SHRINKING, HOST, "no_gain",
     "3 per GPU gained 1.20x after 1.60x: at that rate 4 would gain 0.90x, under 1.05x"),
])
def test_what_holds_a_gpu_is_said_in_a_word_and_in_words(state: GpuLevel, obs: GpuObservation,
                                                        host: HostObservation, held_by: str,
                                                        held: str) -> None:
    new, change = decide(POLICY, state, obs, host, now=5.0)
    assert change is None and new.limit == state.limit
    assert (new.held_by, new.held) == (held_by, held)
    assert held_by in HOLD_CAUSES


def test_a_raise_that_waits_for_cores_is_held_by_the_cpu() -> None:
    cores = CoreRoom(cores=16, held=16, at_once=1, cap=8, waiting=1)  # the 16 threads still held
    turn = step(POLICY, _state(), None, _obs(), HOST, cores, now=5.0)
    assert turn.waiting is not None and turn.change is None
    assert turn.state.held_by == "cpu" and turn.state.held_by in HOLD_CAUSES


def test_an_oom_alone_at_one_per_gpu_holds_the_gpu_by_memory() -> None:
    state, change = decide(POLICY, _state(), _obs(ooms=1), HOST, now=5.0)
    assert change is None
    assert (state.held_by, state.held) == ("memory", "a trial ran out of GPU memory at 1 per GPU")


# --- each bound met exactly -----------------------------------------------------------------

def test_a_bound_met_exactly_is_met() -> None:
    """min_readings readings count; a GPU at target_util is busy; memory exactly one trial's
    need fits it (2000 MiB x 1.25 + 512 = 3012 MiB, the running trial's 500 MiB of growth set
    aside); cores that carry exactly one more trial (85 % of 16 cores at 5 cores a trial: 2
    trials) carry it."""
    _, change = decide(POLICY, _state(), _obs(readings=POLICY.min_readings), HOST, now=5.0)
    assert change is not None and change.new == 2
    state, change = decide(POLICY, _state(), _obs(util=POLICY.target_util), HOST, now=5.0)
    assert change is None and state.held_by == "busy"
    _, change = decide(POLICY, _state(), _obs(free_mib=3012.0 + 500.0), HOST, now=5.0)
    assert change is not None and change.new == 2
    _, change = decide(POLICY, _state(), _obs(cpu_cores=5.0), HOST, now=5.0)
    assert change is not None and change.new == 2


# 5 s alone; one trial of 8 s at two per GPU: exactly CLEAR (2 / 1.6 = 1.25)
CLEAR_TRIAL = _t(8.0)
NEED = 2000.0 * 1.25 + 512.0  # a trial's need in the rules' HOST (500 MiB of growth aside)


@pytest.mark.parametrize(("util", "free", "climbs"), [
    (39.0, 2 * NEED + 500.0, True),  # under target_util x fast_util, memory for exactly two more
    (39.0, 2.5 * NEED + 500.0, True),
    (40.0, 70_000.0, False),  # at target_util x fast_util: not nearly idle
    (39.0, 2 * NEED + 499.0, False),
])
def test_one_clear_trial_is_enough_exactly_at_the_bounds(util: float, free: float,
                                                        climbs: bool) -> None:
    """A trial that shows exactly a CLEAR gain climbs on a GPU under target_util x fast_util
    with memory for two more trials; at 40 % (80 x 0.5), or a MiB short of two trials' memory,
    the second trial is waited for."""
    state, change = _measured_at_two(CLEAR_TRIAL, base=(5.0, 5.0), util=util, free_mib=free)
    assert state.gains[2] == 1.25
    assert (change is not None and change.new == 3) is climbs
    if not climbs:
        assert state.held == "measuring trial durations at 2 per GPU (1 of 2)"


def test_a_gain_of_exactly_climb_gain_is_climbed_past() -> None:
    policy = replace(POLICY, climb_gain=1.25)
    state = _state(limit=2, times={1: {LGBM: (5.0, 5.0)}})
    _, change = decide(policy, state, _obs(running=2, trials=(CLEAR_TRIAL,) * 2), HOST, 1.0)
    assert change is not None and change.new == 3


def test_a_next_level_expected_at_exactly_one_plus_min_gain_is_still_climbed() -> None:
    """Two per GPU gained 1.05x, three per GPU 1.05x again (3.5 s at two, 5 s at three): four,
    shrinking alike, would gain 1.05x, which is not under 1 + min_gain."""
    policy = replace(POLICY, climb_gain=1.0)
    state = _state(limit=3, times={2: {LGBM: (3.5, 3.5)}}, gains={2: 1.05})
    state, change = decide(policy, state, _obs(running=3, trials=(_t(5.0), _t(5.0))), HOST, 1.0)
    assert state.gains[3] == 1.05
    assert change is not None and change.new == 4


def test_one_trial_at_exactly_far_loss_waits_for_a_second() -> None:
    """4 s alone, 16 s at two per GPU: exactly FAR_LOSS (0.5x), not under it; 17 s is."""
    state, change = _measured_at_two(_t(16.0), base=(4.0, 4.0))
    assert state.gains[2] == FAR_LOSS and change is None and state.limit == 2
    _, change = _measured_at_two(_t(17.0), base=(4.0, 4.0))
    assert change is not None and (change.old, change.new) == (2, 1)


def test_a_running_trial_at_exactly_break_even_proves_nothing_yet() -> None:
    """4 s alone: a trial at two per GPU running for 8 s is at break-even, not past it; it is
    no measure of the level (0 of 2), and the level has no gain yet."""
    state, change = _measured_at_two(_t(8.0, running=True), base=(4.0, 4.0))
    assert change is None and 2 not in state.gains
    assert state.held == "measuring trial durations at 2 per GPU (0 of 2)"
    state, _ = _measured_at_two(_t(8.5, running=True), base=(4.0, 4.0))
    assert state.held == "measuring trial durations at 2 per GPU (1 of 2)"


def test_a_gain_is_under_a_bound_only_below_it() -> None:
    gain = _Gain(ratio=1.05, trials=2, of_one_kind=2, fresh=2, thin_base=False, error=0.3)
    assert not gain.surely_under(1.05, 0.0)
    assert replace(gain, ratio=1.04).surely_under(1.05, 0.0)
    assert not replace(gain, ratio=1.04).surely_under(1.05, 1.0)  # within a standard error


def test_the_first_level_needs_min_readings_steady_readings_not_more() -> None:
    from tests.placement.test_rules_first_level import HOST as HOST_OF_TWO
    from tests.placement.test_rules_first_level import _obs as _first_obs

    obs = _first_obs(steady_readings=POLICY.min_readings)
    _, change = decide(POLICY, _state(), obs, HOST_OF_TWO, now=7.0)
    assert change is not None and change.new == 3


# --- the first level -----------------------------------------------------------------------

def test_a_first_level_bound_by_utilization_and_another_limit_alike_names_utilization() -> None:
    """20 % at one per GPU: 80 / 20 = 4 per GPU, scheduler.max_trials_per_gpu's 4 too; the
    utilization is what the jump rests on."""
    from tests.placement.test_rules_first_level import HOST as HOST_OF_TWO
    from tests.placement.test_rules_first_level import _obs as _first_obs

    _, change = decide(POLICY, _state(), _first_obs(steady_util=20.0), HOST_OF_TWO, now=7.0)
    assert change is not None and change.new == 4
    assert "(bound by utilization; 80% / 20% would be 4)" in change.reason


def test_a_first_level_under_two_percent_is_target_over_utilization() -> None:
    from tests.placement.test_rules_first_level import HOST as HOST_OF_TWO
    from tests.placement.test_rules_first_level import _obs as _first_obs

    _, change = decide(POLICY, _state(), _first_obs(steady_util=1.5), HOST_OF_TWO, now=7.0)
    assert change is not None and "would be 53)" in change.reason  # 80 / 1.5


def test_the_first_levels_base_is_every_running_trials_steps_and_the_finished_trials() -> None:
    """Two GPUs judged together, a trial running on each: both their seconds per step are the
    base; a trial that finished at one per GPU is the base as well (no step timed)."""
    from tests.placement.test_rules_first_level import CNN, _running
    from tests.placement.test_rules_first_level import HOST as HOST_OF_TWO
    from tests.placement.test_rules_first_level import _obs as _first_obs

    group = _first_obs(running=1, trials=(_running(0.7), _running(0.8)))
    state, change = decide(POLICY, _state(), group, HOST_OF_TWO, now=7.0)
    assert change is not None and change.new == 3 and state.times[1] == {CNN: (0.7, 0.8)}
    finished = _first_obs(trials=(_t(10.0),))
    state, change = decide(POLICY, _state(), finished, HOST_OF_TWO, now=7.0)
    assert change is not None and change.new == 3 and state.times[1] == {LGBM: (10.0,)}


# --- what a verdict leaves for the next ----------------------------------------------------

def test_a_level_change_is_timed_named_by_its_gpu_and_clears_what_held_it() -> None:
    held = _state(gpu=3, held="measuring utilization", held_by="measuring")
    state, change = decide(POLICY, held, _obs(gpu=3), HOST, now=5.0)
    assert change is not None and change.gpu == 3 and (change.old, change.new) == (1, 2)
    assert (state.since, state.held, state.held_by) == (5.0, None, None)
    state, change = decide(POLICY, _state(gpu=3, limit=3), _obs(gpu=3, running=3, ooms=1), HOST,
                           now=9.0)
    assert change is not None and change.gpu == 3 and (change.old, change.new) == (3, 2)
    assert state.since == 9.0


def test_a_counted_loss_is_one_and_shuts_the_level_for_the_run() -> None:
    """A far loss at two per GPU against a base of two trials: counted once, for good; however
    many trials run at one per GPU since, two is not opened again."""
    state, change = _measured_at_two(_t(50.0))
    assert change is not None and change.reason.endswith("no gain, for good")
    assert state.losses == {2: 1} and state.ceiling == 1
    many = _obs(trials=(_t(10.0),) * (REPROBE_TRIALS + 1))
    state, change = decide(POLICY, state, many, HOST, now=2.0)
    assert change is None and state.ceiling == 1
    assert state.held == "1 per GPU was the best level"


def test_a_level_reached_on_a_re_probe_opens_the_next_after_its_trials() -> None:
    """Three per GPU lost once against a thin base (uncounted, losses {3: 0}), was re-probed
    and reached again: after REPROBE_TRIALS trials there, four is open (it never lost)."""
    state = _state(limit=3, ceiling=3, losses={3: 0}, times={2: {LGBM: (5.0, 5.0)}})
    trials = (_t(5.5),) * REPROBE_TRIALS  # 1.36x of two per GPU
    state, change = decide(POLICY, state, _obs(running=3, trials=trials), HOST, now=2.0)
    assert state.ceiling == 4 and change is not None and (change.old, change.new) == (3, 4)


def test_the_ceiling_never_passes_max_trials_per_gpu() -> None:
    state = _state(limit=4, ceiling=4)
    state, change = decide(POLICY, state, _obs(running=4, trials=(_t(10.0),) * REPROBE_TRIALS),
                           HOST, now=2.0)
    assert change is None and state.ceiling == 4


def test_rates_and_gains_are_kept_to_two_decimals() -> None:
    """What hpo.packing.<host> shows: 2 trials of 7 s, 8.57 trials/min; per step, the rate of
    whole trials (12 s: 5.0 a minute), not of steps; 16.2 s at two per GPU against 10 s,
    1.23x."""
    state, _ = decide(POLICY, _state(), _obs(trials=(_t(7.0), _t(7.0))), HOST, now=5.0)
    assert state.rates == {1: 8.57}
    per_step = (TrialTime(PER_STEP, 0.5, duration=12.0),) * 2
    state, _ = decide(POLICY, _state(), _obs(trials=per_step), HOST, now=5.0)
    assert state.rates == {1: 5.0}
    state, _ = _measured_at_two(_t(16.2), _t(16.2))
    assert state.gains == {2: 1.23}


# --- durations that say nothing, and every visit's durations ----------------------------------

def test_a_duration_of_no_time_is_left_out_of_a_verdict() -> None:
    """Durations of 0 s (no time measured) at either level, now or at an earlier visit, are no
    trials: a far loss against a base of one real trial is still an uncounted one."""
    with_zeros = _state(limit=2, times={1: {LGBM: (0.0, 10.0)}}, past={2: {LGBM: (0.0,)}})
    without = _state(limit=2, times={1: {LGBM: (10.0,)}})
    trials = _obs(running=2, trials=(_t(0.0), _t(50.0)))
    state, change = decide(POLICY, with_zeros, trials, HOST, now=1.0)
    expected_state, expected = decide(POLICY, without, _obs(running=2, trials=(_t(50.0),)), HOST,
                                      now=1.0)
    assert change is not None and expected is not None and change.reason == expected.reason
    assert change.reason.endswith(f"tried again after {REPROBE_TRIALS} trials at 1")
    assert (state.losses, state.gains) == (expected_state.losses, expected_state.gains) == \
        ({2: 0}, {2: 0.4})


def test_an_earlier_visits_sub_second_steps_still_count() -> None:
    """Two per GPU was visited before, its trials at 0.8 s a step: with this visit's one trial
    the level rests on three, enough to be judged (and climbed: 1.25x at 60 %)."""
    state = _state(limit=2, times={1: {PER_STEP: (0.5, 0.5)}}, past={2: {PER_STEP: (0.8, 0.8)}})
    obs = _obs(running=2, trials=(TrialTime(PER_STEP, 0.8, duration=20.0),))
    state, change = decide(POLICY, state, obs, HOST, now=1.0)
    assert change is not None and (change.old, change.new) == (2, 3)


# --- the public helpers ----------------------------------------------------------------------

def test_a_running_trial_past_the_expected_peak_grows_no_more() -> None:
    obs = _obs(free_mib=10_000.0, running_mem_mib=(2500.0, 1500.0))
    assert memory_room(POLICY, obs, HOST) == (10_000.0 - 500.0, NEED)


def test_a_run_starts_at_a_settled_level_within_max_trials_per_gpu() -> None:
    """Settled at four per GPU before, three allowed now: the run starts at three, judged
    against the levels below three only."""
    times = {1: {LGBM: (10.0,)}, 2: {LGBM: (6.0,)}, 3: {LGBM: (5.0,)}}
    state = start_from(replace(POLICY, max_per_gpu=3), 2, 4, times, now=7.0)
    assert state is not None
    assert (state.gpu, state.limit, state.since, state.ceiling) == (2, 3, 7.0, 3)
    assert state.times == state.past == {1: {LGBM: (10.0,)}, 2: {LGBM: (6.0,)}}


def test_a_level_may_rise_below_the_cap_unless_shut_above() -> None:
    assert may_rise(POLICY, _state(limit=3))
    assert not may_rise(POLICY, _state(limit=4))
    assert not may_rise(POLICY, _state(limit=3, losses={4: 1}))


def test_the_first_levels_utilization_bound_is_target_over_utilization_as_read() -> None:
    """1.6 % (readings of 1, 2, 2, 2, 1 %): 80 / 1.6 is 50 trials, where floor division of
    the floats makes it 49 (1.6 is a hair over 1.6 in binary); 3.2 %: 25, not 24."""
    from tests.placement.test_rules_first_level import HOST as HOST_OF_TWO
    from tests.placement.test_rules_first_level import _obs as _first_obs

    for util, level in ((1.6, 50), (3.2, 25)):
        _, change = decide(POLICY, _state(), _first_obs(steady_util=util), HOST_OF_TWO, now=7.0)
        assert change is not None and f"would be {level})" in change.reason
