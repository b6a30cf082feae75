"""The words a packing verdict is given in (placement/_rules.py), from their promise: status
and report show them, so a level at its ceiling says which ceiling and whether it is tried
again, and a measured level says its rate and its gain over the level below."""

from __future__ import annotations

from hpo_orchestrator.placement._rules import (
    FINAL_LOSSES,
    REPROBE_TRIALS,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    _Ask,
    _at_ceiling,
    _measured,
)


def _ask(limit: int, ceiling: int, losses: dict[int, int] | None = None,
         max_per_gpu: int = 4) -> _Ask:
    state = GpuLevel(gpu=0, limit=limit, ceiling=ceiling, losses=losses or {})
    obs = GpuObservation(gpu=0, running=limit, util=50.0, readings=10, free_mib=1000.0)
    host = HostObservation(cores=16, concurrency=limit, cap=8, mem_peak_mib=None)
    return _Ask(policy=PackingPolicy(max_per_gpu=max_per_gpu), state=state, obs=obs, host=host,
                gain=None, below=None)


def test_below_both_ceilings_nothing_holds_a_level() -> None:
    assert _at_ceiling(_ask(limit=2, ceiling=3)) is None
    assert _at_ceiling(_ask(limit=2, ceiling=4, max_per_gpu=3)) is None


def test_the_ceiling_a_level_meets_is_named() -> None:
    assert _at_ceiling(_ask(limit=4, ceiling=4)) == (
        "max_trials_per_gpu", "at scheduler.max_trials_per_gpu=4")
    final = _ask(limit=2, ceiling=2, losses={3: FINAL_LOSSES})
    assert _at_ceiling(final) == ("no_gain", "2 per GPU was the best level")
    for losses in ({}, {3: FINAL_LOSSES - 1}, {2: FINAL_LOSSES}):  # the level above not shut
        assert _at_ceiling(_ask(limit=2, ceiling=2, losses=losses)) == ("no_gain", (
            f"2 per GPU was the best level so far (3 is tried again after {REPROBE_TRIALS} "
            "trials)"))


def test_a_measured_level_says_its_rate_and_gain() -> None:
    state = GpuLevel(gpu=0, limit=2, rates={2: 3.456, 1: 2.0}, gains={2: 1.4})
    assert _measured(state, 2) == "3.5 trials/min, 1.40x the level below"
    assert _measured(state, 1) == "2.0 trials/min"  # the first level: no gain
    assert _measured(state, 3) == "rate unknown"
    assert _measured(GpuLevel(gpu=0, gains={2: 0.9}), 2) == "rate unknown, 0.90x the level below"


def test_a_first_jump_bound_by_cores_or_parallel_is_whole_levels() -> None:
    """A group of GPUs adds one trial per GPU a level: the cores left (or scheduler.parallel's
    places) for 3 more trials over 2 GPUs make one more level, not one and a half."""
    from hpo_orchestrator.placement._rules import _first_level

    policy = PackingPolicy(max_per_gpu=16)
    state = GpuLevel(gpu=0, limit=1, ceiling=16)
    obs = GpuObservation(gpu=0, running=1, util=10.0, readings=10, free_mib=80_000.0,
                         running_mem_mib=(1000.0,), steady_util=10.0, steady_readings=5)
    by_cores = HostObservation(cores=5, concurrency=2, cap=16, mem_peak_mib=1000.0, adds=2)
    by_parallel = HostObservation(cores=64, concurrency=2, cap=5, mem_peak_mib=1000.0, adds=2)
    for host, bound in ((by_cores, "CPU cores"), (by_parallel, "scheduler.parallel")):
        found = _first_level(policy, state, obs, host)
        assert found is not None and found[0] == 2 and isinstance(found[0], int), found
        assert f"bound by {bound}" in found[1]
