"""The first level of a packed GPU (placement/_rules.py ``_first_level``): from its first
trial's steady utilization straight to ``target_util / utilization`` trials, as far as memory,
cores and ``scheduler.parallel`` allow; then confirmed by throughput like any level, backed
off on a loss or an OOM. And what makes it quick: a warm-up that reports steps measures its
level from its first report on (placement/_trial_times.py), and the steady utilization is
read only once every running trial has reported a step (placement/_packer.py)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from hpo_orchestrator.placement._rules import (
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    TrialTime,
    decide,
)
from hpo_orchestrator.placement._trial_times import TrialTimes

POLICY = PackingPolicy(target_util=80.0, max_per_gpu=4)
# two GPUs judged together (adds=2), one trial on each so far, 32 cores, room for 16 at once
HOST = HostObservation(cores=32, concurrency=2, cap=16, mem_peak_mib=1000.0, adds=2)
CNN = "batch_size=128/step"  # a kind measured per step


def _running(per_step: float = 0.7) -> TrialTime:
    return TrialTime(CNN, per_step, running=True, duration=5.0)


def _obs(**kw: Any) -> GpuObservation:
    base: dict[str, Any] = dict(gpu=0, running=1, util=12.0, readings=8, free_mib=130_000.0,
                                running_mem_mib=(1000.0,), trials=(_running(),), ooms=0,
                                cpu_cores=2.0, steady_util=23.0, steady_readings=4)
    return GpuObservation(**{**base, **kw})


def _state(**kw: Any) -> GpuLevel:
    return GpuLevel(**{"gpu": 0, "limit": 1, "since": 0.0, "ceiling": 4, **kw})


def test_a_gpu_a_quarter_busy_goes_to_three_at_once() -> None:
    """The CNN on an H200: 23 % at one per GPU, memory and cores to spare: three per GPU
    (80 / 23), before any trial ended; the running trial's seconds per step are level 1's
    base for the verdict at three."""
    state, change = decide(POLICY, _state(), _obs(), HOST, now=7.0)
    assert change is not None and (change.old, change.new) == (1, 3)
    assert change.reason.startswith("23% utilization at 1 per GPU: 3 per GPU (bound by utilization")
    assert state.limit == 3 and state.since == 7.0
    assert state.times[1] == {CNN: (0.7,)} and state.past[1] == {CNN: (0.7,)}


@pytest.mark.parametrize(("obs", "host", "policy", "level", "bound"), [
    (_obs(steady_util=9.0), HOST, POLICY, 4, "scheduler.max_trials_per_gpu"),
    (_obs(steady_util=9.0), HOST, replace(POLICY, max_per_gpu=6), 6, "scheduler.max_trials_per_gpu"),
    # 1000 MiB peak x 1.25 + 512 = 1762 MiB a trial; growth of the running one set aside
    (_obs(free_mib=500.0 + 1762.0 + 100.0, running_mem_mib=(500.0,)), HOST, POLICY, 2,
     "GPU memory"),
    # 2 running + 2 a level on 4 cores, their CPU use not measured yet: a trial per core
    (_obs(cpu_cores=None), replace(HOST, cores=4), POLICY, 2, "CPU cores"),
    # measured, the two trials use half a core: 85 % of 4 cores carries 13 such trials
    (_obs(cpu_cores=0.5), replace(HOST, cores=4), POLICY, 3, "utilization"),
    (_obs(), replace(HOST, cap=4), POLICY, 2, "scheduler.parallel"),
    # 2 trials use 5 cores: 2.5 each; 85 % of 8 cores holds 2 of them: 1 per GPU of 2
    (_obs(cpu_cores=5.0), replace(HOST, cores=8), POLICY, None, None),
    (_obs(cpu_cores=5.0), replace(HOST, cores=16), POLICY, 2, "host CPU"),
])
def test_the_first_level_stops_at_what_runs_out_first(obs: GpuObservation, host: HostObservation,
                                                       policy: PackingPolicy, level: int | None,
                                                       bound: str | None) -> None:
    _, change = decide(policy, _state(ceiling=policy.max_per_gpu), obs, host, now=7.0)
    if level is None:
        assert change is None
        return
    assert change is not None and change.new == level
    assert f"(bound by {bound};" in change.reason


@pytest.mark.parametrize("obs", [
    _obs(steady_util=None, steady_readings=0),  # a trial still in its set-up
    _obs(steady_readings=2),  # too few readings since its first step
    _obs(steady_util=85.0),  # busy enough already
    _obs(steady_util=45.0),  # 80 / 45 is one trial
    _obs(trials=(TrialTime("*", 5.0, running=True),)),  # no step timed: no base to judge on
    _obs(running=0),
    _obs(running_mem_mib=(), free_mib=None),
])
def test_no_first_level_without_a_steady_reading_room_and_a_base(obs: GpuObservation) -> None:
    state, change = decide(POLICY, _state(), obs, HOST, now=7.0)
    assert change is None or change.new == 2  # at most the usual one-level climb
    assert state.limit in (1, 2)


def test_the_first_level_is_taken_once() -> None:
    """Back at level 1 after a loss, the GPU climbs one level at a time as before."""
    state = _state(past={1: {CNN: (0.7,)}, 3: {CNN: (2.5,)}}, losses={3: 1}, ceiling=2)
    _, change = decide(POLICY, state, _obs(), HOST, now=50.0)
    assert change is None or change.new == 2


def test_a_first_level_that_loses_goes_back_down() -> None:
    """Three per GPU ran each step 3.3x slower than one (0.91x the steps per minute): measured
    on two trials, that is no gain, and the level goes to two."""
    state, change = decide(POLICY, _state(), _obs(), HOST, now=7.0)
    assert change is not None and state.limit == 3
    slow = tuple(TrialTime(CNN, 2.3, duration=25.0) for _ in range(4))
    state, change = decide(POLICY, state, _obs(running=3, trials=slow), HOST, now=40.0)
    assert change is not None and (change.old, change.new) == (3, 2)
    assert "no gain" in change.reason and state.ceiling == 2


def test_a_first_level_that_gains_is_kept_and_judged_further() -> None:
    """Three per GPU at 1.1 s per step against 0.7 s alone: 1.9x the steps per minute. Kept;
    the GPU at 70 % may still take a fourth, judged against three."""
    state, _ = decide(POLICY, _state(), _obs(), HOST, now=7.0)
    fast = tuple(TrialTime(CNN, 1.1, duration=12.0) for _ in range(3))
    state, change = decide(POLICY, state, _obs(running=3, util=70.0, trials=fast), HOST, now=40.0)
    assert state.gains[3] == pytest.approx(1.91, abs=0.01)
    assert change is not None and (change.old, change.new) == (3, 4)


def test_an_oom_at_the_first_level_backs_off_one() -> None:
    state, _ = decide(POLICY, _state(), _obs(), HOST, now=7.0)
    state, change = decide(POLICY, state, _obs(running=3, ooms=1), HOST, now=9.0)
    assert change is not None and (change.old, change.new) == (3, 2) and state.ceiling == 2


# --- which trials measure -------------------------------------------------------------------


def test_a_warm_up_that_reports_steps_measures_per_step_after_its_first() -> None:
    """A worker's first trial (CUDA context, cuDNN set-up) reported epochs at 4, 5 and 6 s:
    its seconds per step (1.0) measure the level, its 4 s of set-up do not."""
    times = TrialTimes(reuse=True)
    warm = times.span(0, 1, {"lr": 0.1}, 0.0, reports=[(1, 4.0), (2, 5.0), (3, 6.0)])
    assert times.warmup(warm)
    assert times.measured(0, 0.0, [warm], now=6.5) == (TrialTime("*/step", 1.0, running=True,
                                                                 duration=6.5),)
    once = times.span(0, 2, {"lr": 0.1}, 0.0, reports=[(1, 4.0)])
    assert times.measured(0, 0.0, [once], now=6.5) == ()  # one step: nothing timed yet


def test_a_warm_up_slows_its_neighbours_only_until_its_first_report() -> None:
    """Trial A (worker 1, warmed) beside a new worker's first trial B: A is tainted while B
    starts up. Once B reported a step, a trial C that starts then measures its level."""
    times = TrialTimes(reuse=True)
    times.ended(times.span(0, 1, {"lr": 0.1}, 0.0, 3.0))  # worker 1's warm-up, long done
    b = times.span(0, 2, {"lr": 0.2}, 10.0, reports=[(1, 14.0), (2, 15.0)])
    a = times.span(0, 1, {"lr": 0.3}, 12.0, reports=[(1, 1.0), (2, 2.0)])
    c = times.span(0, 1, {"lr": 0.4}, 24.5, reports=[(1, 1.0), (2, 2.0)])
    measured = times.measured(0, 0.0, [b, a, c], now=27.0)
    assert [t.seconds for t in measured] == [1.0, 1.0]  # B and C; A overlapped B's start-up
    silent = times.span(0, 3, {"lr": 0.5}, 20.0)  # a new worker that reports nothing: all of it
    assert times.measured(0, 0.0, [silent, c], now=27.0) == ()


# --- whole studies on scripted fake GPUs (slow) ---------------------------------------------


def _overlap_per_gpu(db: Any) -> dict[int, int]:
    from datetime import datetime

    from tests.conftest import max_overlap, trial_rows

    spans: dict[int, list[Any]] = {}
    for row in trial_rows(db):
        if row["end"] is not None:
            spans.setdefault(row["attrs"]["hpo.gpu_index"], []).append(
                (datetime.fromisoformat(row["start"]), datetime.fromisoformat(row["end"])))
    return {gpu: max_overlap(s) for gpu, s in spans.items()}


def _packing(db: Any) -> dict[str, Any]:
    import json
    import sqlite3

    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT value_json FROM study_user_attributes "
                           "WHERE key LIKE 'hpo.packing.%'").fetchall()
    return json.loads(rows[0][0]) if rows else {}


# trials of 10 steps of 0.3 s: a trial's steady readings (after its first step) outlast the
# three the first level needs even on a loaded machine; the two fakes are one model, judged
# together as the GPUs of a real host are
CURVES = ("objective=custom", "objective.target=tests.objectives:curves",
          "pruner=none", "telemetry.interval_s=0.2", "scheduler.host_cores=8")
QUARTER_BUSY = {"HPO_ORCHESTRATOR_FAKE_GPUS": '{"gpus": [{"busy_util": 25, "name": "H200"}, '
                                                  '{"busy_util": 25, "name": "H200"}]}',
                "HPO_TEST_STEP_S": "0.3"}


@pytest.mark.slow
def test_gpus_a_quarter_busy_run_several_trials_each_by_default(cli) -> None:  # type: ignore[no-untyped-def]
    """No scheduler.parallel: two GPUs whose trials leave them 25 % busy go from one trial
    each to three (80 / 25) once the first trials reported a step, the run says so as it
    happens, and the trials really overlapped on each GPU."""
    result = cli("run", *CURVES, "study.n_trials=14", env=QUARTER_BUSY)
    assert result.code == 0, result.stderr
    assert "1 per GPU to start, more while throughput rises" in result.stdout
    changes = _packing(result.db)["changes"]
    # each GPU's first change is the first level: 3 (80 / 25), or 2 where the cores the trials
    # use on a loaded test machine bound it ("host CPU")
    firsts = {gpu: next(c for c in changes if c["gpu"] == gpu) for gpu in (0, 1)}
    for first in firsts.values():
        assert first["from"] == 1 and first["to"] in (2, 3), first
        # about 25 %: a loaded machine's sampler may catch a trial between two others
        assert re.match(rf"2\d% utilization at 1 per GPU: {first['to']} per GPU", first["reason"])
    notes = [line for line in result.stdout.splitlines()
             if re.search(r"trials per GPU \(2\d% utilization at 1 per GPU", line)]
    assert {"gpu0", "gpu1"} <= {word.strip(",:") for line in notes for word in line.split()}
    overlap = _overlap_per_gpu(result.db)
    assert set(overlap) == {0, 1} and min(overlap.values()) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["scheduler.parallel=2", "scheduler.trials_per_gpu=1"])
def test_a_number_given_is_exactly_that_many(cli, setting: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", *CURVES, "study.n_trials=6", setting, env=QUARTER_BUSY)
    assert result.code == 0, result.stderr
    assert _packing(result.db) == {}  # no packing: nothing measured, nothing recorded
    assert _overlap_per_gpu(result.db) == {0: 1, 1: 1}


def test_the_steady_utilization_starts_when_every_running_trial_reported() -> None:
    """Readings from while a trial imported torch and made its CUDA context (0 %) are left
    out: only those after the last of the running trials' first reports count."""
    from hpo_orchestrator.placement import RunningView
    from hpo_orchestrator.placement._packer import _steady
    from hpo_orchestrator.telemetry import DeviceReading

    readings = [DeviceReading(float(t), 0.0 if t < 6 else 30.0, 1000.0) for t in range(12)]
    first = RunningView(gpu=0, worker=1, started=0.0, reports=((1, 4.0), (2, 5.0)))
    second = RunningView(gpu=0, worker=2, started=1.0, reports=((1, 5.0),))  # first step at t = 6
    assert _steady(readings, [first, second]) == [30.0] * 6
    assert _steady(readings, [first]) == [0.0, 0.0] + [30.0] * 6
    waiting = RunningView(gpu=0, worker=3, started=2.0)
    assert _steady(readings, [first, waiting]) == []
    assert _steady(readings, []) == []


# --- scheduler.first_level=fill ---------------------------------------------------------------

FILL = replace(POLICY, first_level="fill")


@pytest.mark.parametrize(("util", "under", "fill"), [
    (36.0, 2, 3),  # the CNN on an H200 (gpu-o61): two stay under 80 %, three reach it
    (27.0, 2, 3),
    (25.0, 3, 4),
    (40.0, 2, 2),  # two reach 80 % exactly: no third
    (16.0, 4, 4),  # five would reach it; four at most either way
])
def test_fill_goes_to_the_fewest_trials_that_reach_the_target(util: float, under: int,
                                                              fill: int) -> None:
    """under: the most trials whose shares stay under 80 %, then one more once a trial timed
    that level; fill: where that climb would end, at once."""
    for policy, level in ((POLICY, under), (FILL, fill)):
        _, change = decide(policy, _state(), _obs(steady_util=util), HOST, now=7.0)
        assert change is not None and change.new == level, (policy.first_level, util)
    _, change = decide(FILL, _state(), _obs(steady_util=36.0), HOST, now=7.0)
    assert change is not None
    assert "80% / 36% would be 3, rounded up)" in change.reason


def test_fill_keeps_to_memory_cores_and_parallel() -> None:
    """Rounding up is the utilization's bound only: the others still cap it."""
    room_for_one = _obs(steady_util=36.0, free_mib=500.0 + 1762.0 + 100.0, running_mem_mib=(500.0,))
    _, change = decide(FILL, _state(), room_for_one, HOST, now=7.0)
    assert change is not None and change.new == 2 and "(bound by GPU memory;" in change.reason
    _, change = decide(FILL, _state(), _obs(steady_util=36.0), replace(HOST, cap=4), now=7.0)
    assert change is not None and change.new == 2 and "(bound by scheduler.parallel;" in change.reason


def test_fill_overshooting_is_undone_by_throughput() -> None:
    """Three per GPU that run each step 3.3x slower than one: no gain, back to two, as any
    level that does not pay."""
    state, _ = decide(FILL, _state(), _obs(steady_util=36.0), HOST, now=7.0)
    assert state.limit == 3
    slow = tuple(TrialTime(CNN, 2.3, duration=25.0) for _ in range(4))
    state, change = decide(FILL, state, _obs(running=3, trials=slow), HOST, now=40.0)
    assert change is not None and (change.old, change.new) == (3, 2) and state.ceiling == 2
