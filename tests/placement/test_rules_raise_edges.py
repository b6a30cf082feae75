"""The packing rules (placement/_rules.py) at edges their docstrings promise and no test met,
for the mutants mutmut found unguarded (docs/MUTATION.md, "mutmut"): the first jump is for a
GPU that never left level 1; the start-up raise (``scheduler.startup_overlap``) takes a GPU
that read idle, under ``startup_idle_util``, where the cores carry the new trial and memory
fits it, exactly at each bound, under a ceiling of STARTUP_LEVEL itself; its reason in words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpo_orchestrator.placement._rules import STARTUP_LEVEL, GpuLevel, decide, may_overlap
from tests.placement.test_packer import HOST, LGBM, POLICY, _obs, _state, _t

OVERLAP = replace(POLICY, startup_overlap=True)


def _starting(**kw: object) -> object:
    """The first trial still starting on an idle GPU (no step, no end)."""
    return _obs(**{"running": 1, "trials": (_t(3.0, running=True),), "starting": True,
                   "latest_util": (0.0,) * POLICY.min_readings, **kw})


def test_a_gpu_back_at_one_after_leaving_it_makes_no_first_jump() -> None:
    """_first_jump: "Level 1, never left yet". A GPU that was at two and came back to one
    (its ``past`` holds level 2; no loss counted) climbs as usual, one level at a time."""
    steady = {"steady_util": 20.0, "steady_readings": POLICY.min_readings}
    _, jump = decide(POLICY, _state(), _obs(**steady), HOST, now=5.0)
    assert jump is not None and jump.new == 4  # 80 % / 20 %: the first jump, never left
    back = _state(times={1: {LGBM: (10.0, 10.0)}}, past={1: {}, 2: {LGBM: (12.0,)}})
    _, change = decide(POLICY, back, _obs(**steady), HOST, now=5.0)
    assert change is not None and change.new == 2


@pytest.mark.parametrize(("latest", "raised"), [
    ((POLICY.startup_idle_util - 0.5,) * POLICY.min_readings, True),
    ((POLICY.startup_idle_util,) * POLICY.min_readings, False),  # "under": the bound is busy
])
def test_the_start_up_raise_needs_readings_under_the_idle_bound(latest: tuple[float, ...],
                                                               raised: bool) -> None:
    state, change = decide(OVERLAP, _state(), _starting(latest_util=latest), HOST, now=5.0)
    assert (change is not None and change.new == STARTUP_LEVEL and state.startup) is raised


def test_the_start_up_raise_in_words() -> None:
    _, change = decide(OVERLAP, _state(), _starting(), HOST, now=5.0)
    assert change is not None and change.reason == (
        f"started during the first trial's start-up (GPU idle: under {POLICY.startup_idle_util:g}% "
        f"in its last {POLICY.min_readings} readings, no step reported yet); its first steps "
        "confirm or undo it")


def test_the_start_up_raise_where_the_cores_and_memory_just_fit() -> None:
    """The cores carry exactly the trials after the raise (one per core without readings:
    two on two cores); memory free is exactly what one more trial needs."""
    host = replace(HOST, cores=2, concurrency=1)
    _, change = decide(OVERLAP, _state(), _starting(), host, now=5.0)
    assert change is not None and change.new == STARTUP_LEVEL
    _, change = decide(OVERLAP, _state(), _starting(), replace(host, cores=1), now=5.0)
    assert change is None
    need = HOST.mem_peak_mib * POLICY.mem_margin + POLICY.mem_reserve_mib  # type: ignore[operator]
    exactly = {"free_mib": need, "running_mem_mib": (HOST.mem_peak_mib,)}
    _, change = decide(OVERLAP, _state(), _starting(**exactly), HOST, now=5.0)
    assert change is not None and change.new == STARTUP_LEVEL
    _, change = decide(OVERLAP, _state(), _starting(**{**exactly, "free_mib": need - 1}), HOST, now=5.0)
    assert change is None


def test_a_ceiling_of_the_start_up_level_itself_allows_the_overlap() -> None:
    """may_overlap: "under a ceiling above it" (level 1): max_trials_per_gpu=2 is above one."""
    assert may_overlap(replace(OVERLAP, max_per_gpu=STARTUP_LEVEL), GpuLevel(gpu=0, ceiling=4))
    assert not may_overlap(replace(OVERLAP, max_per_gpu=1), GpuLevel(gpu=0, ceiling=4))
