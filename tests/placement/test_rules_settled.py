"""The level a study settled at, kept for its next run (placement/_rules.py ``settled_level``,
``start_from``; the packer keeps it in hpo.packing.<host>'s "settled"): the next run of the same
objective on the same GPU model starts there, judged against the earlier run's durations
below, so a slowdown and an OOM still back off (issue 51.1)."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement._rules import (
    FINAL_LOSSES,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    TrialTime,
    decide,
    settled_level,
    start_from,
)
from tests.placement.test_packer import _Clock, _Readings, _run, packer_of

POLICY = PackingPolicy(target_util=80.0, max_per_gpu=4)
HOST = HostObservation(cores=16, concurrency=3, cap=8, mem_peak_mib=1000.0, running=3)
CNN = "batch_size=128/step"
BELOW = {1: {CNN: (0.7, 0.7, 0.72)}}


def _obs(**kw: Any) -> GpuObservation:
    base: dict[str, Any] = dict(gpu=0, running=3, util=60.0, readings=8, free_mib=100_000.0,
                                running_mem_mib=(1000.0,) * 3, trials=(), ooms=0, cpu_cores=3.0)
    return GpuObservation(**{**base, **kw})


@pytest.mark.parametrize(("state", "settled"), [
    # three per GPU, judged against one (1.91x): settled there, with one's durations
    (GpuLevel(gpu=0, limit=3, ceiling=4, times={1: BELOW[1], 3: {CNN: (1.1,)}}, gains={3: 1.91}),
     (3, BELOW)),
    # three per GPU not judged yet (the run ended mid-climb): nothing settled
    (GpuLevel(gpu=0, limit=3, ceiling=4, times=BELOW), None),
    # back at one after two lost for good: settled at one, nothing to start from
    (GpuLevel(gpu=0, limit=1, ceiling=1, times=BELOW, losses={2: FINAL_LOSSES}), (1, {})),
    (GpuLevel(gpu=0, limit=1, ceiling=4, times=BELOW), None),  # one, still climbing
])
def test_a_level_is_settled_once_judged(state: GpuLevel, settled: Any) -> None:
    assert settled_level(state) == settled


def test_the_next_run_starts_at_the_settled_level() -> None:
    state = start_from(POLICY, 0, 3, BELOW, now=5.0)
    assert state is not None and (state.limit, state.since, state.ceiling) == (3, 5.0, 4)
    assert state.times == BELOW and state.past == BELOW
    assert start_from(POLICY, 0, 1, {}, now=5.0) is None  # nothing above one to start from
    assert start_from(POLICY, 0, 3, {}, now=5.0) is None  # no base: it could never be judged
    capped = start_from(PackingPolicy(max_per_gpu=2), 0, 3, BELOW, now=5.0)
    assert capped is not None and capped.limit == 2  # scheduler.max_trials_per_gpu lowered


def test_a_started_level_that_is_slower_now_backs_off() -> None:
    """Started at three: its trials now take 2.4 s a step against the earlier 0.7 alone
    (0.88x the steps/min): no gain, down to two, judged on the earlier run's base."""
    state = start_from(POLICY, 0, 3, BELOW, now=5.0)
    assert state is not None
    slow = tuple(TrialTime(CNN, 2.4, duration=25.0) for _ in range(4))
    state, change = decide(POLICY, state, _obs(trials=slow), HOST, now=40.0)
    assert change is not None and (change.old, change.new) == (3, 2) and "no gain" in change.reason
    # at 1.1 s a step it gains 1.93x: kept (the GPU 85 % busy, it goes no higher)
    fast = tuple(TrialTime(CNN, 1.1, duration=12.0) for _ in range(3))
    started = start_from(POLICY, 0, 3, BELOW, now=5.0)
    assert started is not None
    kept, change = decide(POLICY, started, _obs(trials=fast, util=85.0), HOST, now=40.0)
    assert change is None and kept.limit == 3 and kept.gains[3] == pytest.approx(1.93, abs=0.01)


def test_an_oom_at_the_started_level_backs_off() -> None:
    state = start_from(POLICY, 0, 3, BELOW, now=5.0)
    assert state is not None
    state, change = decide(POLICY, state, _obs(ooms=1), HOST, now=6.0)
    assert change is not None and (change.old, change.new) == (3, 2) and state.ceiling == 2


GPU = [GpuInfo(index=0, uuid="GPU-0", name="H200", memory_total_mib=143_771)]
AUTO = ["scheduler.parallel=auto", "scheduler.host_cores=16"]


def _settled_run(study: Any, clock: _Clock) -> None:
    """A run of objective "cnn" that went to two per GPU and kept it (2x the steps/min)."""
    packer = packer_of(GPU, AUTO, _Readings(), study, objective="cnn")
    packer.pool.acquire()
    _run(packer, clock, 30.0, steps=10, step_s=2.0)  # the worker's first trial: a warm-up
    for _ in range(2):
        _run(packer, clock, 22.0, steps=10, step_s=2.0)
    assert packer.tick([]) is True and packer.pool.limits[0] == 2
    for _ in range(2):
        _run(packer, clock, 22.0, threads=8, steps=10, step_s=2.0)
    clock.now += 2.0
    packer.tick([])
    packer.close()


def test_a_study_starts_where_its_last_run_settled(clock: _Clock) -> None:
    """Run one climbs to two per GPU and keeps it; run two of the same objective on the same
    GPU model starts at two, says why, and the attr keeps the level; another objective, or
    another GPU model, starts at one."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    _settled_run(study, clock)
    (entry,) = study.user_attrs["hpo.packing.h"]["settled"]
    assert (entry["objective"], entry["gpu"], entry["level"]) == ("cnn", "H200", 2)
    again = packer_of(GPU, AUTO, _Readings(), study, objective="cnn")
    assert again.pool.limits[0] == 2 and again.levels[0].times[1]
    (note,) = again.take_notes()
    assert note.startswith("gpu0: 1 -> 2 trials per GPU (an earlier run of this study settled")
    assert study.user_attrs["hpo.packing.h"]["settled"] == [entry]  # kept, not yet re-settled
    assert packer_of(GPU, AUTO, _Readings(), study, objective="mlp").pool.limits[0] == 1
    other = [GpuInfo(index=0, uuid="GPU-0", name="A100", memory_total_mib=81_920)]
    assert packer_of(other, AUTO, _Readings(), study, objective="cnn").pool.limits[0] == 1
    # a run with fixed levels keeps the settled level for the next auto run
    from hpo_orchestrator.placement._packer import forget_packing

    forget_packing(study, "h")
    assert study.user_attrs["hpo.packing.h"]["settled"] == [entry]
