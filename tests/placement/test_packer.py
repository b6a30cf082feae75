"""scheduler.trials_per_gpu=auto: the pure rules (placement/_rules.py), the slot pool's
per-GPU levels, and whole studies on scripted fake GPUs (slow).

The fake GPUs: a GPU at 20 % utilization while trials run on it (room for more), one at 95 %
(full), one with too little memory for another trial; an objective that runs out of memory
once a GPU runs two trials at a time.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpo_orchestrator.config import load_config
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement import Packer, RunningView, SlotPool, decode
from hpo_orchestrator.placement._rules import (
    CoreRoom,
    GpuLevel,
    GpuObservation,
    HostObservation,
    PackingPolicy,
    TrialTime,
    decide,
    expected_peak_mib,
    step,
)
from hpo_orchestrator.placement._trial_times import trial_kind
from tests.conftest import max_overlap, trial_rows

POLICY = PackingPolicy(target_util=80.0, max_per_gpu=4)
HOST = HostObservation(cores=16, concurrency=1, cap=8, mem_peak_mib=2000.0)
LGBM, TORCH = "kind=lightgbm", "kind=torch"


def _t(seconds: float, kind: str = LGBM, running: bool = False) -> TrialTime:
    return TrialTime(kind, seconds, running)


def _obs(**kw: Any) -> GpuObservation:
    base: dict[str, Any] = dict(gpu=0, running=1, util=60.0, readings=5, free_mib=70_000.0,
                                running_mem_mib=(1500.0,), trials=(_t(10.0), _t(10.0)), ooms=0)
    return GpuObservation(**{**base, **kw})


def _state(**kw: Any) -> GpuLevel:
    return GpuLevel(**{"gpu": 0, "limit": 1, "since": 0.0, "ceiling": 4, **kw})


# --- the rules ----------------------------------------------------------------------------


def test_low_utilization_with_room_adds_a_trial() -> None:
    state, change = decide(POLICY, _state(), _obs(), HOST, now=5.0)
    assert change is not None and (change.old, change.new) == (1, 2)
    assert "60% utilization < 80%" in change.reason
    assert state.limit == 2 and state.since == 5.0 and state.rates == {1: 6.0}
    assert state.times == {1: {LGBM: (10.0, 10.0)}}


@pytest.mark.parametrize(("obs", "host", "held"), [
    (_obs(util=95.0), HOST, "95% utilization >= scheduler.target_gpu_util=80"),
    (_obs(free_mib=2500.0), HOST, "GPU memory: 2000 MiB free"),  # 500 MiB of growth set aside
    (_obs(trials=(_t(10.0),)), HOST, "measuring trial durations at 1 per GPU (1 of 2)"),
    (_obs(trials=(_t(10.0), _t(30.0, running=True))), HOST, "(1 of 2)"),  # running: no measure
    (_obs(trials=(), util=10.0), HOST, "(0 of 2)"),
    (_obs(readings=1), HOST, "measuring utilization"),
    (_obs(running=0), HOST, "0 of its 1 places busy"),
    (_obs(), replace(HOST, concurrency=16, cap=32), "no CPU core"),
    (_obs(cpu_cores=14.5), HOST, "host CPU: the running trials use 14.5 of 16 cores"),
    (_obs(), replace(HOST, cap=1), "at scheduler.parallel=1"),
    (_obs(), replace(HOST, mem_peak_mib=None), "GPU memory unknown"),
])
def test_what_holds_a_gpu_at_its_level(obs: GpuObservation, host: HostObservation,
                                       held: str) -> None:
    state, change = decide(POLICY, _state(), obs, host, now=5.0)
    assert change is None and state.limit == 1
    assert state.held is not None and held in state.held


def test_level_one_is_left_after_two_trials_even_on_an_idle_gpu() -> None:
    """Level 1 is the base every later level is judged on: one trial is too thin a base."""
    state, change = decide(POLICY, _state(), _obs(util=10.0, trials=(_t(10.0),)), HOST, now=5.0)
    assert change is None and "measuring trial durations at 1 per GPU (1 of 2)" in (state.held or "")
    _, change = decide(POLICY, state, _obs(util=10.0, trials=(_t(10.0), _t(11.0))), HOST, now=6.0)
    assert change is not None and change.new == 2


def test_cpu_in_use_under_the_limit_does_not_hold() -> None:
    """The torch MLP's trials use a core or two of sixteen: room for more."""
    _, change = decide(POLICY, _state(), _obs(cpu_cores=2.0), HOST, now=5.0)
    assert change is not None and change.new == 2


def test_the_cap_holds_it() -> None:
    state, change = decide(POLICY, _state(limit=4), _obs(running=4), HOST, now=5.0)
    assert change is None and "max_trials_per_gpu=4" in (state.held or "")


def test_no_gain_backs_off_for_good() -> None:
    """Trials of 10 s alone took 11 s two at a time (1.82x): kept. Three at a time took 18 s
    each: 0.92x of two. Two such trials are within one standard error of a gain (the spread
    is not measured yet, 0.2 is assumed); four are not: back to two, and three is never
    tried again. A level barely under the bar (16 s, 1.03x) is kept: against two trials at
    two per GPU it cannot be told from a gain."""
    state = _state(limit=2, times={1: {LGBM: (10.0, 10.0)}})
    state, change = decide(POLICY, state, _obs(running=2, trials=(_t(11.0), _t(11.0))), HOST, 1.0)
    assert change is not None and change.new == 3 and state.gains[2] == pytest.approx(1.82, 0.01)
    kept, change = decide(POLICY, state, _obs(running=3, trials=(_t(16.0),) * 4), HOST, 2.0)
    assert change is None and kept.limit == 3 and kept.gains[3] == pytest.approx(1.03, 0.01)
    state, change = decide(POLICY, state, _obs(running=3, trials=(_t(18.0), _t(18.0))), HOST, 2.0)
    assert change is None and state.limit == 3
    state, change = decide(POLICY, state, _obs(running=3, trials=(_t(18.0),) * 4), HOST, 2.0)
    assert change is not None and (change.old, change.new) == (3, 2)
    assert "0.92x the trials/min of 2 per GPU" in change.reason and "for good" in change.reason
    assert state.ceiling == 2
    state, change = decide(POLICY, state, _obs(running=2, trials=()), HOST, 3.0)
    assert change is None and state.limit == 2 and "2 per GPU was the best level" in (state.held or "")


def test_trials_are_compared_with_their_own_kind() -> None:
    """Alone: LightGBM 4 s, torch 8 s. Two at a time, the two trials measured so far are both
    torch, at 12 s: 1.33x the throughput for that kind. Pooled, 12 s against a mean of 6 s
    would have read as no gain at all."""
    state = _state(limit=2, times={1: {LGBM: (4.0, 4.0), TORCH: (8.0, 8.0)}})
    obs = _obs(running=2, trials=(_t(12.0, TORCH), _t(12.0, TORCH)))
    state, change = decide(POLICY, state, obs, HOST, 1.0)
    assert change is not None and change.new == 3 and state.gains[2] == pytest.approx(1.33, 0.01)


def test_without_a_common_kind_nothing_is_judged() -> None:
    """Only LightGBM ran alone (10 s), only torch at two per GPU (30 s): a torch trial says
    nothing about LightGBM's level, so the level waits for a LightGBM trial."""
    state = _state(limit=2, times={1: {LGBM: (10.0, 10.0)}})
    state, change = decide(POLICY, state, _obs(running=2, trials=(_t(30.0, TORCH),) * 2), HOST, 1.0)
    assert change is None and state.limit == 2 and state.ceiling == 4 and 2 not in state.gains


def test_a_far_loss_backs_off_on_one_running_trial() -> None:
    """LightGBM on the GPU (issue 17): 3.4 s alone; at two per GPU a trial has already run
    14 s, 4.1x its time alone: two at a time cannot beat one (0.49x at best, under FAR_LOSS).
    Back off now, before the trial ends, and stay at one. At 9 s (0.76x at best) one trial is
    within the noise of its neighbours: wait for a second."""
    state = _state(limit=2, times={1: {LGBM: (3.4, 3.4)}})
    state, change = decide(POLICY, state, _obs(running=2, trials=(_t(9.0, running=True),)),
                           HOST, 1.0)
    assert change is None and "measuring trial durations at 2" in (state.held or "")
    state, change = decide(POLICY, state, _obs(running=2, trials=(_t(14.0, running=True),)),
                           HOST, 2.0)
    assert change is not None and (change.old, change.new) == (2, 1) and state.ceiling == 1
    assert "0.49x the trials/min of 1 per GPU (1 trials" in change.reason


@pytest.mark.parametrize(("util", "free", "climbs"), [(10.0, 70_000.0, True),
                                                      (60.0, 70_000.0, False),
                                                      (10.0, 6_000.0, False)])
def test_a_nearly_idle_gpu_climbs_on_one_clear_trial(util: float, free: float, climbs: bool) -> None:
    """One trial at two per GPU took 12 s where 10 s alone (1.67x): enough to climb on when
    the GPU is nearly idle with memory for two more trials; otherwise the second trial is
    waited for."""
    state = _state(limit=2, times={1: {LGBM: (10.0, 10.0)}})
    obs = _obs(running=2, util=util, free_mib=free, running_mem_mib=(), trials=(_t(12.0),))
    state, change = decide(POLICY, state, obs, HOST, 1.0)
    assert (change is not None and change.new == 3) is climbs
    if not climbs:
        assert "measuring trial durations at 2 per GPU (1 of 2)" in (state.held or "")


def test_an_oom_backs_off_and_caps() -> None:
    state, change = decide(POLICY, _state(limit=3), _obs(running=3, ooms=1), HOST, now=5.0)
    assert change is not None and (change.old, change.new) == (3, 2)
    assert "out of GPU memory" in change.reason and state.ceiling == 2
    state, change = decide(POLICY, _state(limit=1), _obs(ooms=1), HOST, now=5.0)
    assert change is None and state.ceiling == 1 and state.limit == 1
    # shut for the run: trials at one per GPU never lift the ceiling
    state, change = decide(POLICY, state, _obs(util=10.0, trials=(_t(10.0),) * 9), HOST, now=6.0)
    assert change is None and state.ceiling == 1 and "1 per GPU was the best level" in (state.held or "")


def test_a_raise_waits_for_the_cores_the_running_trials_hold() -> None:
    """A raise decided while the running trials hold the new share's cores waits, said in
    ``held``; it is made once they leave that share free; a drop, or threads fixed by
    scheduler.threads_per_trial (no room given), never waits; an OOM at the old level
    cancels a waiting raise and the level is decided afresh."""
    def room(held: int) -> CoreRoom:  # one GPU at 1, its raise counted: 16 cores over 2
        return CoreRoom(cores=16, held=held, at_once=1, cap=8, waiting=1)

    assert (room(8).share(), room(8).enough(), room(9).enough()) == (8, True, False)
    held = step(POLICY, _state(), None, _obs(), HOST, room(16), now=5.0)
    assert held.change is None and held.state.limit == 1 and held.waiting is not None
    assert held.state.held == "going to 2 per GPU once the running trials leave 8 cores free"
    assert held.verdict is not None and held.verdict.limit == 2  # what decide said
    still = step(POLICY, held.state, held.waiting, _obs(), HOST, room(9), now=6.0)
    assert still == replace(held, verdict=None)  # nothing else changes meanwhile
    made = step(POLICY, held.state, held.waiting, _obs(), HOST, room(8), now=7.0)
    assert made.change is not None and (made.change.old, made.change.new) == (1, 2)
    assert (made.state.limit, made.state.since, made.waiting) == (2, 7.0, None)
    fixed = step(POLICY, _state(), None, _obs(), HOST, None, now=5.0)
    assert fixed.change is not None and (fixed.state.limit, fixed.state.since) == (2, 5.0)
    oom = step(POLICY, held.state, held.waiting, _obs(ooms=1), HOST, room(8), now=7.0)
    assert oom.change is None and oom.waiting is None and oom.state.limit == 1
    assert "ran out of GPU memory" in (oom.state.held or "")
    drop = step(POLICY, _state(limit=2), None, _obs(ooms=1), HOST, room(16), now=5.0)
    assert drop.change is not None and drop.state.limit == 1


def test_trial_kind_is_its_categorical_parameters() -> None:
    assert trial_kind({"kind": "torch", "lr": 0.1, "layers": 3}) == "kind=torch"
    assert trial_kind({"lr": 0.1}) == "*"
    # a categorical number (the CNN's batch_size) is a kind too; the same number as an int
    # parameter is not; numbers while their choices multiply to at most MAX_KINDS (4)
    cnn = {"batch_size": 64, "lr": 0.1, "kind": "torch"}
    assert trial_kind(cnn, {"batch_size": 3, "kind": 2}) == "batch_size=64,kind=torch"
    assert trial_kind(cnn) == "kind=torch"
    assert trial_kind({"batch_size": 32}, {"batch_size": 5}) == "*"  # too many choices
    two = {"batch_size": 64, "layers": 2, "width": 128}
    assert trial_kind(two, {"batch_size": 2, "layers": 2, "width": 3}) == "batch_size=64,layers=2"


def test_expected_peak_is_the_largest_finished_else_running() -> None:
    assert expected_peak_mib([100.0, 900.0, 300.0], [5000.0]) == 900.0
    assert expected_peak_mib([], [700.0, 200.0]) == 700.0
    assert expected_peak_mib([], []) is None


# --- the slot pool ------------------------------------------------------------------------

GPUS = [GpuInfo(index=i, uuid=f"GPU-{i}", name="fake") for i in range(2)]


def test_auto_pool_starts_at_one_per_gpu_and_grows_per_gpu() -> None:
    pool = SlotPool.of(GPUS, "auto", None, max_per_gpu=3)
    assert pool.auto and pool.limits == {0: 1, 1: 1} and pool.concurrency == 2
    taken = [pool.acquire(), pool.acquire()]
    assert {s.gpu.index for s in taken if s and s.gpu} == {0, 1} and pool.acquire() is None
    pool.set_limit(0, 3)
    more = [pool.acquire(), pool.acquire()]
    assert [s.gpu.index for s in more if s and s.gpu] == [0, 0] and pool.acquire() is None
    assert pool.busy_on(0) == 3 and pool.concurrency == 4
    pool.set_limit(0, 9)  # never more places than max_trials_per_gpu
    assert pool.limits[0] == 3


def test_parallel_bounds_auto() -> None:
    pool = SlotPool.of(GPUS, 3, "auto", max_per_gpu=4)
    pool.set_limit(0, 4)
    pool.set_limit(1, 4)
    assert pool.concurrency == 3


def test_parallel_auto_with_fixed_level_fills_every_gpu() -> None:
    pool = SlotPool.of(GPUS, "auto", 2)
    assert not pool.auto and pool.limits == {0: 2, 1: 2} and pool.concurrency == 4


def test_parallel_auto_without_gpus_is_one_trial_per_core() -> None:
    pool = SlotPool.of([], "auto", None, cores=3)
    assert pool.concurrency == 3 and not pool.limits


@pytest.mark.parametrize("override", ["scheduler.parallel=many", "scheduler.trials_per_gpu=0",
                                      "scheduler.target_gpu_util=0", "scheduler.max_trials_per_gpu=0",
                                      "telemetry.max_rows_per_trial=1"])
def test_bad_packing_keys_are_config_errors(override: str) -> None:
    with pytest.raises(ConfigError):
        load_config([override])


def test_auto_keys_load() -> None:
    config = load_config(["scheduler.parallel=auto", "scheduler.trials_per_gpu=auto"])
    assert config.scheduler.parallel == "auto" and config.scheduler.trials_per_gpu == "auto"


# --- whole studies on scripted fake GPUs (slow) ---------------------------------------------

TARGET = "objective.target=tests.objectives:"
AUTO = ("scheduler.parallel=auto", "scheduler.max_trials_per_gpu=3", "scheduler.host_cores=8",
        "telemetry.interval_s=0.2", "pruner=none", "objective=custom")


def _packing(db: Path) -> dict[str, Any]:
    with sqlite3.connect(db) as con:
        (value,) = con.execute("SELECT value_json FROM study_user_attributes "
                               "WHERE key LIKE 'hpo.packing.%'").fetchone()
    return json.loads(value)


def _overlap_per_gpu(db: Path) -> dict[int, int]:
    spans: dict[int, list[Any]] = {}
    for row in trial_rows(db):
        if row["end"] is not None:
            from datetime import datetime
            spans.setdefault(row["attrs"]["hpo.gpu_index"], []).append(
                (datetime.fromisoformat(row["start"]), datetime.fromisoformat(row["end"])))
    return {gpu: max_overlap(s) for gpu, s in spans.items()}


@pytest.mark.long
@pytest.mark.slow
def test_auto_adds_trials_only_where_the_gpu_has_room(cli) -> None:  # type: ignore[no-untyped-def]
    """GPU0 at 20 % with memory to spare gets three trials at once (80 / 20, capped at
    scheduler.max_trials_per_gpu=3) once its first trial reported a step; GPU1 at 95 % and
    GPU2 (20 %, but 2.5 GiB for trials of 1 GiB) stay at one. The recorded history says so,
    and the trials' real overlap per GPU matches it."""
    gpus = {"gpus": [{"busy_util": 20}, {"busy_util": 95},
                     {"busy_util": 20, "memory_total_mib": 2500}]}
    # Steps long enough that the first trial still runs when the GPU has been read min_readings
    # times since its first step (at 0.4 s a slow machine lost that race: one level at a time)
    result = cli("run", *AUTO, TARGET + "pinned", "study.n_trials=27",
                 env={"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps(gpus), "HPO_TEST_STEP_S": "0.8"})
    assert result.code == 0, result.stderr
    packing = _packing(result.db)
    assert packing["mode"] == "auto" and packing["mps"]["active"] is False
    levels = {entry["gpu"]: entry for entry in packing["levels"]}
    assert levels[1]["limit"] == 1 and "utilization >= scheduler.target_gpu_util" in levels[1]["held"]
    assert levels[2]["limit"] == 1 and "GPU memory" in levels[2]["held"]
    changes = [(c["gpu"], c["from"], c["to"]) for c in packing["changes"]]
    # straight to 80 / 20 trials, capped at scheduler.max_trials_per_gpu=3 (the first level)
    assert changes[0] == (0, 1, 3)
    assert packing["changes"][0]["reason"].startswith("20% utilization at 1 per GPU: 3 per GPU")
    assert {gpu for gpu, _, _ in changes} == {0}  # the full GPU and the small one never grew
    top = max(to for _, _, to in changes)
    assert levels[0]["limit"] >= 2 and top <= 3
    overlap = _overlap_per_gpu(result.db)
    assert 2 <= overlap[0] <= top and overlap[1] == 1 and overlap[2] == 1

    status = cli("status", "--json")
    assert status.code == 0, status.stderr
    shown = json.loads(status.stdout)["packing"]
    assert [(c["gpu"], c["from"], c["to"]) for c in shown[0]["changes"]] == changes
    low = [f for f in json.loads(status.stdout)["findings"] if f["code"] == "low_gpu_util"]
    assert any("trials_per_gpu=auto ran up to" in f["message"] for f in low)
    text = cli("status").stdout
    assert "trials_per_gpu=auto" in text and "gpu0 1 -> 3" in text


@pytest.mark.long
@pytest.mark.slow
def test_an_oom_makes_auto_back_off(cli) -> None:  # type: ignore[no-untyped-def]
    """A GPU with room for one trial: auto tries three (utilization is low), a trial runs
    out of memory, the level goes back down and never above that again; retries finish the
    study."""
    # No spare worker: the fake GPU counts every process pinned to it as holding memory, so a
    # spare waiting beside the first trial would be its "OOM" already (tests/scheduler/test_spares.py).
    # Steps long enough for the first trial's utilization to be read before it ends (at 0.3 s
    # it ended first on a fast machine and not on a slow one)
    result = cli("run", *AUTO, TARGET + "oom_when_shared", "study.n_trials=10",
                 "scheduler.spare_workers=false",
                 env={"HPO_ORCHESTRATOR_FAKE_GPUS": '{"gpus": [{"busy_util": 20}]}',
                      "HPO_TEST_STEP_S": "0.8"})
    assert result.code == 0, result.stderr
    packing = _packing(result.db)
    changes = [(c["from"], c["to"], c["reason"]) for c in packing["changes"]]
    assert changes[0][:2] == (1, 3), changes  # 80 % / 20 %, capped at 3: memory looks ample
    first_oom = next(i for i, c in enumerate(changes) if "out of GPU memory" in c[2])
    old, new, _ = changes[first_oom]
    assert new == old - 1
    assert all(to <= new for _, to, _ in changes[first_oom:])  # capped from then on
    assert packing["levels"][0]["limit"] <= new
    rows = trial_rows(result.db)
    assert any(r["attrs"].get("hpo.fail_reason") == "oom" for r in rows)
    counted = [r for r in rows if not r["attrs"].get("hpo.retried")]
    assert len(counted) == 10  # failed attempts that were retried don't count against n_trials


# --- the packer: which trials measure, threads, a raise that waits for cores ---------------


class _Readings:
    """A telemetry sampler's readings, scripted: a GPU at 20 % with 70 GB free, trials that
    use ``cpu`` host cores."""

    def __init__(self, cpu: float | None = 2.0) -> None:
        self.cpu = cpu  # None: no CPU readings (the sampler has no full round yet)

    def device_readings(self, gpu_index: int, since: float) -> list[Any]:
        from hpo_orchestrator.telemetry._sampler import DeviceReading

        return [DeviceReading(since, 20.0, 10_000.0)] * 5

    def cpu_readings(self, since: float) -> list[float]:
        return [] if self.cpu is None else [self.cpu] * 5

    def running_mem_peaks(self, gpu_index: int) -> list[float]:
        return []


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _rt(slot: Any, threads: int, spawned_at: float, pid: int = 1,
        kind: str = "lightgbm", reports: list[tuple[int, float]] | None = None,
        batch: int | None = None) -> RunningView:
    """A running trial; ``batch``: a categorical batch_size (the CNN's) beside ``kind``."""
    params: dict[str, Any] = {"kind": kind, "lr": 0.01}
    choices = {"kind": 2}
    if batch is not None:
        params["batch_size"] = batch
        choices["batch_size"] = 3
    return RunningView(gpu=slot.gpu_index, worker=pid, started=spawned_at, threads=threads,
                       params=params, choices=choices, reports=tuple(reports or ()))


def packer_of(gpus: list[GpuInfo], overrides: list[str], readings: Any,
              study: Any = None, objective: str = "") -> Packer:
    """A packer of ``overrides``' settings on ``gpus``, on host "h", its pool built from them."""
    import optuna

    settings = decode(load_config(overrides).scheduler, gpus, cores=16, host="h",
                      run_folder=Path("."), objective=objective)
    study = study or optuna.create_study(storage=optuna.storages.InMemoryStorage())
    return Packer(settings, SlotPool(settings.places), readings, study)


def _packer(cpu: float | None = 2.0, *overrides: str) -> Any:
    gpus = [GpuInfo(index=0, uuid="GPU-0", name="fake", memory_total_mib=80_000)]
    return packer_of(gpus, ["scheduler.parallel=auto", "scheduler.host_cores=16", *overrides],
                     _Readings(cpu))


def _earlier_auto_run(study: Any) -> None:
    """hpo.packing.h as a trials_per_gpu=auto run left it: two per GPU, one change."""
    study.set_user_attr("hpo.packing.h", {
        "mode": "auto", "target_gpu_util": 80, "max_trials_per_gpu": 4, "cores": 16,
        "mps": {"active": False}, "levels": [{"gpu": 0, "limit": 2, "held": None}],
        "changes": [{"time": "2026-11-28T10:00:00", "gpu": 0, "from": 1, "to": 2,
                     "reason": "gained 1.4x"}]})


@pytest.mark.parametrize("gpus", [1, 0], ids=["fixed levels", "no GPU"])
def test_a_later_run_that_does_not_pack_shows_no_earlier_packing(
        monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    """An earlier auto run's hpo.packing.<host> was shown by status and report after a later
    run of the host with fixed levels (or on no GPU) as if that run had packed."""
    import optuna

    from hpo_orchestrator.placement import _packer
    from hpo_orchestrator.status import packing_lines

    monkeypatch.setattr(_packer, "detect_mps", lambda: {"active": False})
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    _earlier_auto_run(study)
    assert packing_lines({"host": "h", **study.user_attrs["hpo.packing.h"]})  # shown before
    if gpus:
        packer_of([GpuInfo(index=0, uuid="GPU-0", name="fake", memory_total_mib=80_000)],
                  ["scheduler.parallel=1"], None, study)
    else:
        _packer.forget_packing(study, "h")
    entry = study.user_attrs["hpo.packing.h"]
    assert entry["mode"] == "fixed" and entry["changes"] == []
    assert packing_lines({"host": "h", **entry}) == []
    # a host whose runs never packed gets no entry at all (fixed levels, no MPS)
    _packer.forget_packing(study, "other")
    assert "hpo.packing.other" not in study.user_attrs


def _run(packer: Any, clock: _Clock, seconds: float, threads: int = 16, pid: int = 1,
         kind: str = "lightgbm", steps: int = 0, step_s: float = 0.0,
         batch: int | None = None) -> None:
    """One trial on GPU 0 that runs ``seconds`` from now and ends, reporting ``steps`` steps
    ``step_s`` apart, the last as it ends."""
    reports = [(k, seconds - (steps - k) * step_s) for k in range(1, steps + 1)]
    rt = _rt(packer.pool.slots[0], threads, clock.now, pid, kind, reports, batch)
    clock.now += seconds
    packer.trial_ended(rt, None, 1000.0)


def test_auto_threads_are_the_cores_left_and_a_raise_waits_for_them(clock: _Clock) -> None:
    """One GPU at level 1: the trial gets all 16 cores. Its worker's first trial (a warm-up)
    and two of 10 s: the level rises while a 16-thread trial runs, but without a measure of
    the CPU the trials use, the pool keeps one place until that trial is gone (16 + 8
    threads would oversubscribe the cores); its place is refilled with 8 threads, then the
    second place opens with the other 8. (Without the start-up overlap, whose place the first
    trial's threads leave free: tests/placement/test_rules_startup.py.)"""
    packer = _packer(None, "scheduler.startup_overlap=false")
    slot = packer.pool.slots[0]
    assert packer.threads_for_next([]) == 16
    packer.pool.acquire()
    for seconds in (30.0, 10.0, 10.0):
        _run(packer, clock, seconds)
    assert packer.tick([_rt(slot, 16, clock.now)]) is False and packer.pool.limits[0] == 1
    assert "going to 2 per GPU once the running trials leave 8 cores free" in packer.levels[0].held
    assert packer.threads_for_next([]) == 8  # its place, refilled, already gets the new share
    clock.now += 2.0
    assert packer.tick([_rt(slot, 8, clock.now)]) is True and packer.pool.limits[0] == 2
    assert packer.threads_for_next([]) == 8
    assert packer.threads_for_next([_rt(slot, 14, clock.now)]) == 2
    history = packer.study.user_attrs["hpo.packing.h"]
    assert [(c["from"], c["to"]) for c in history["changes"]] == [(1, 2)]
    assert history["levels"][0]["rates"] == {"1": 6.0}  # the 30 s warm-up left out


def test_a_raise_is_made_at_once_where_the_trials_use_few_cores(clock: _Clock) -> None:
    """The same trials measured at 2 of the 16 cores (a GPU trial given 16 threads uses a
    few): the raise does not wait for the 16-thread trial's end (issue 51: workload c ran one
    trial for its first 14 s); the new place gets its share, 8 threads."""
    packer = _packer(cpu=2.0)
    slot = packer.pool.slots[0]
    packer.pool.acquire()
    for seconds in (30.0, 10.0, 10.0):
        _run(packer, clock, seconds)
    assert packer.tick([_rt(slot, 16, clock.now)]) is True and packer.pool.limits[0] == 2
    assert packer.threads_for_next([_rt(slot, 16, clock.now)]) == 8


def test_warm_ups_and_the_trials_beside_them_do_not_measure_a_level(clock: _Clock) -> None:
    """Issue 17's gpu_mix on an H100: a worker's first torch trial ran 19 s, later ones 8 s.
    The first trial of each kind in a worker is a warm-up; a trial that ran beside a warm-up
    on its GPU (slowed by that worker's imports and kernel builds) does not count either."""
    from hpo_orchestrator.placement._trial_times import TrialTimes

    times = TrialTimes(reuse=True)
    for pid, kind, start, end in [(1, "lightgbm", 0, 6), (1, "torch", 6, 25), (1, "lightgbm", 25, 29),
                                  (1, "torch", 29, 37), (2, "lightgbm", 30, 40), (1, "torch", 41, 50)]:
        times.ended(times.span(0, pid, {"kind": kind}, start, end))
    assert times.measured(0, 0.0, [], now=60.0) == (_t(4.0), _t(9.0, TORCH))
    running = times.span(0, 2, {"kind": "lightgbm"}, 50.0)  # worker 2 has run LightGBM: counts
    warming = times.span(0, 3, {"kind": "torch"}, 55.0)  # a new worker: taints what runs beside it
    assert times.measured(0, 0.0, [running], now=54.0)[-1] == _t(4.0, running=True)
    assert times.measured(0, 0.0, [running, warming], now=58.0) == (_t(4.0), _t(9.0, TORCH))
    fresh = TrialTimes(reuse=False)  # one process per trial: its start is part of every trial
    fresh.ended(fresh.span(0, 7, {"kind": "torch"}, 0.0, 19.0))
    assert fresh.measured(0, 0.0, [], now=20.0) == (_t(19.0, TORCH),)
    assert not times.warmup(running) and times.warmup(warming)


def test_trials_that_report_steps_measure_per_step() -> None:
    """A pruned trial ran fewer steps than a complete one: its duration says nothing of the
    level, its seconds per step do (set-up and first step left out). One step reported: only
    compared with trials that ended after one; none: the whole duration, as before."""
    from hpo_orchestrator.placement._trial_times import TrialTimes

    times = TrialTimes(reuse=False)
    complete = [(k, 3.0 + 2.0 * (k - 1)) for k in range(1, 11)]  # 3 s to step 1, then 2 s a step
    times.ended(times.span(0, 1, {}, 0.0, 22.0, reports=complete))
    times.ended(times.span(0, 2, {}, 22.0, 29.5, reports=complete[:3]))  # pruned at step 3
    times.ended(times.span(0, 3, {}, 30.0, 33.5, reports=complete[:1]))  # pruned at step 1
    times.ended(times.span(0, 4, {}, 34.0, 40.0))  # reports nothing
    two = times.span(0, 5, {}, 40.0, reports=complete[:2])  # running, at step 2 since 45 s
    one = times.span(0, 6, {}, 40.0, reports=complete[:1])  # running, one step: not yet
    assert times.measured(0, 0.0, [two, one], now=47.0) == (
        TrialTime("*/step", 2.0, duration=22.0), TrialTime("*/step", 2.0, duration=7.5),
        TrialTime("*/1 step", 3.5), TrialTime("*", 6.0),
        TrialTime("*/step", 2.0, running=True, duration=7.0))  # (7 - 3) s over steps 2 and 3


def test_the_per_step_measure_takes_what_the_trial_measured() -> None:
    """From the review of 9fca679: a running trial is judged by its reports alone (time after
    its last one, a final evaluation say, is not a slow step; nor is a step of 100 iterations
    taken for one); steps that do not rise with time (any order is Optuna's) fall back to the
    duration, never a negative time per step (math.log refused it and the loop died)."""
    from hpo_orchestrator.placement._trial_times import TrialTimes

    times = TrialTimes(reuse=False)
    tail = times.span(0, 1, {}, 0.0, reports=[(1, 3.0), (2, 4.0), (3, 5.0)])  # 11 s after
    spaced = times.span(0, 2, {}, 0.0, reports=[(100, 3.0), (200, 4.3)])  # global_step
    measured = times.measured(0, 0.0, [tail, spaced], now=16.0)
    assert [(t.kind, round(t.seconds, 6), t.running, t.duration) for t in measured] == [
        ("*/step", 1.0, True, 16.0), ("*/step", 0.013, True, 16.0)]
    down = [(10 - k, 3.0 + k) for k in range(10)]  # steps 10, 9, ..., 1
    times.ended(times.span(0, 3, {}, 0.0, 13.0, reports=down))
    final_zero = [(k, 3.0 + k) for k in range(1, 11)] + [(0, 14.5)]
    times.ended(times.span(0, 4, {}, 20.0, 35.0, reports=final_zero))
    assert times.measured(0, 0.0, [], now=40.0) == (TrialTime("*", 13.0), TrialTime("*", 15.0))


def test_a_revisited_level_shows_every_visits_trials_per_minute() -> None:
    """The trials/min shown for a level (hpo.packing's rates) rest on every visit's trials
    where they were judged by duration, as before the per-step measure."""
    state = GpuLevel(gpu=0, limit=2, ceiling=4, times={1: {LGBM: (10.0, 10.0)}},
                     past={2: {LGBM: (10.0, 10.0)}})
    obs = _obs(running=2, util=95.0, trials=(_t(20.0),))
    new, _ = decide(POLICY, state, obs, replace(HOST, concurrency=2), now=1.0)
    assert new.rates[2] == pytest.approx(2 * 60.0 / (40.0 / 3), abs=0.01)


def test_a_per_step_verdict_says_steps_per_minute() -> None:
    """Compared per step, a level's verdict is about steps per minute: its trials/min also
    count the trials the pruner stopped early, and would contradict it."""
    step = "*/step"
    state = GpuLevel(gpu=0, limit=2, ceiling=4, times={1: {step: (1.0, 1.0, 1.0)}})
    obs = _obs(running=2, trials=(TrialTime(step, 2.4, duration=30.0),) * 2)
    new, change = decide(POLICY, state, obs, replace(HOST, concurrency=2), now=1.0)
    assert change is not None and new.limit == 1
    assert "2 per GPU ran 0.83x the steps/min of 1 per GPU (2 trials" in change.reason


@pytest.mark.parametrize(("steps", "verdict"), [(True, None), (False, "no gain")])
def test_a_level_of_longer_trials_is_judged_per_step(clock: _Clock, steps: bool,
                                                     verdict: str | None) -> None:
    """Workload (c) under HyperbandPruner: at 1 per GPU the measured trials were pruned at
    step 3 (6 s), at 2 per GPU they ran all 10 steps (22 s), 10 % slower a step. Judged on
    durations two trials read 0.55x and shut the level for the run on a GPU a quarter busy;
    per step the level gains 1.8x."""
    packer = _packer()
    packer.pool.acquire()
    _run(packer, clock, 30.0)  # the worker's first trial: a warm-up, left out
    for _ in range(2):
        _run(packer, clock, 6.0, steps=3 if steps else 0, step_s=2.0)
    assert packer.tick([]) is True and packer.pool.limits[0] == 2
    packer.pool.acquire()
    for _ in range(2):
        _run(packer, clock, 22.0, threads=8, steps=10 if steps else 0, step_s=2.2)
    clock.now += 2.0
    packer.tick([])
    changes = packer.study.user_attrs["hpo.packing.h"]["changes"]
    if verdict is None:
        assert packer.levels[0].gains[2] == pytest.approx(2 / 1.1, abs=0.01)
        assert not any("no gain" in c["reason"] for c in changes)
        assert changes[-1]["reason"].endswith("1.82x the level below per step)")
    else:
        assert packer.pool.limits[0] == 1 and verdict in changes[-1]["reason"]
        assert "0.55x the trials/min of 1 per GPU" in changes[-1]["reason"]


def test_a_categorical_batch_size_is_a_kind_of_its_own(clock: _Clock) -> None:
    """Workload (c)'s CNN suggests ``batch_size`` from 64, 128 and 256: an epoch (its step) at
    64 takes about 3x as long as at 256. Level 1 ran both; level 2 only 64, each step 1.1x
    slower. Compared as one kind, 64's steps read as a 1.7x slowdown against the mix (a 1.17x
    gain); each size compared with its own, level 2 gains 2 / 1.1 = 1.82x."""
    packer = _packer()
    packer.pool.acquire()
    for batch, step_s in ((256, 1.0), (64, 3.0)) * 3:  # the first: a warm-up
        _run(packer, clock, 10 * step_s + 2.0, steps=10, step_s=step_s, batch=batch)
    assert packer.tick([]) is True and packer.pool.limits[0] == 2
    packer.pool.acquire()
    for _ in range(2):
        _run(packer, clock, 35.0, threads=8, steps=10, step_s=3.3, batch=64)
    clock.now += 2.0
    packer.tick([])
    assert packer.levels[0].gains[2] == pytest.approx(2 / 1.1, abs=0.01)


def test_the_packer_sees_a_trials_categorical_choices() -> None:
    """The view the loop hands the packer (RunningTrial.view) carries how many choices each
    categorical parameter has, from the trial's distributions: trial_kind compares the CNN's
    batch sizes apart only knowing them; other parameters are no kind."""
    from types import SimpleNamespace

    import optuna

    from hpo_orchestrator.placement import Slot
    from hpo_orchestrator.scheduler import RunningTrial

    trial = SimpleNamespace(params={"batch_size": 64, "lr": 0.01, "kind": "torch"}, distributions={
        "batch_size": optuna.distributions.CategoricalDistribution([64, 128, 256]),
        "kind": optuna.distributions.CategoricalDistribution(["torch"]),
        "lr": optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)})
    rt = RunningTrial(trial=trial, slot=Slot(id=3, gpu=GPUS[1]),  # type: ignore[arg-type]
                      worker=SimpleNamespace(process=SimpleNamespace(pid=42)),  # type: ignore[arg-type]
                      attempt=1, spawned_at=5.0, spawned_epoch=0.0, oom_kills_at_spawn=None,
                      threads=4, reports=[(1, 2.0)])
    view = rt.view()
    assert view == RunningView(gpu=1, worker=42, started=5.0, threads=4, params=trial.params,
                               choices={"batch_size": 3, "kind": 1}, reports=((1, 2.0),))
    rt.outcome = SimpleNamespace()  # type: ignore[assignment]
    assert rt.view().ended and RunningTrial.view(replace(rt, slot=Slot(id=0, gpu=None))).gpu is None


def _unsuggested(slot: Any, spawned_at: float, pid: int) -> Any:
    """A running trial seen before its objective suggested anything (a fresh worker
    importing torch, torch_mlp generating its data): no params yet."""
    return replace(_rt(slot, 8, spawned_at, pid), params={}, choices={})


def test_a_trial_not_yet_suggested_is_no_kind_and_no_warm_up() -> None:
    """torch_mlp's batch_size has four choices, MAX_KINDS. A running trial seen before its
    suggestions neither counts as a fifth kind (that pooled every trial for the run) nor as
    a warm-up of a kind its worker never ran (that left out the trials beside it); batch
    sizes are compared apart but a worker warms up once, not per size."""
    from hpo_orchestrator.placement._trial_times import MAX_KINDS, TrialTimes

    choices = {"batch_size": 4}
    times = TrialTimes(reuse=True)
    times.span(0, 1, {}, 0.0)  # a tick saw it before batch_size was suggested
    t = 0.0
    for size in (64, 128, 256, 512) * 2:
        times.ended(times.span(0, 1, {"batch_size": size}, t, t + 10.0, choices=choices))
        t += 10.0
    measured = times.measured(0, 0.0, [], now=t)
    assert len(measured) == 7  # only the worker's first trial warmed up
    assert {m.kind for m in measured} == {f"batch_size={b}" for b in (64, 128, 256, 512)}
    starting = times.span(0, 1, {}, t)  # worker 1's next trial, its suggestions not in yet
    assert not times.warmup(starting)
    assert times.measured(0, 0.0, [starting], now=t + 1.0)[:7] == measured  # all still count
    assert times.warmup(times.span(0, 2, {}, t))  # a new worker's first trial is one
    models = TrialTimes(reuse=True)  # four models and a trial not suggested yet: four kinds
    models.span(0, 1, {}, 0.0)
    for n in range(MAX_KINDS):
        models.ended(models.span(0, 1, {"model": f"m{n}"}, 10.0 * n, 10.0 * n + 10.0))
    assert not models.pooled


def test_kinds_pooled_after_a_climb_still_judge_the_level(clock: _Clock) -> None:
    """Level 1 measured one model; at level 2 a fifth model ended and every trial became one
    kind. Level 1's durations are pooled too: kept under their old kind, no later trial met
    them, and level 2 stayed 'measuring trial durations (0 of 2)' for good, gaining 2x."""
    packer = _packer()
    packer.pool.acquire()
    for _ in range(3):  # the first: a warm-up
        _run(packer, clock, 10.0, kind="m0")
    assert packer.tick([]) is True and packer.pool.limits[0] == 2
    packer.pool.acquire()
    for n in range(1, 5):  # four more models: past MAX_KINDS, one kind for good
        _run(packer, clock, 10.0, threads=8, kind=f"m{n}")
    for _ in range(2):
        _run(packer, clock, 10.0, threads=8, kind="m0")
    clock.now += 2.0
    packer.tick([])
    assert packer._times.pooled
    assert packer.levels[0].gains.get(2) == pytest.approx(2.0, abs=0.01), packer.levels[0].held


def test_many_kinds_are_measured_as_one(clock: _Clock) -> None:
    """Five kinds: nearly every trial would be a first of its kind in its worker, so every
    trial is one kind and only each worker's first trial is a warm-up."""
    from hpo_orchestrator.placement._trial_times import MAX_KINDS, TrialTimes

    times = TrialTimes(reuse=True)
    for n in range(MAX_KINDS + 1):
        times.ended(times.span(0, 1, {"model": f"m{n}"}, 10.0 * n, 10.0 * n + 10.0))
    assert [t.kind for t in times.measured(0, 0.0, [], now=60.0)] == ["*"] * MAX_KINDS


def test_auto_holds_when_the_trials_use_the_host_cores(clock: _Clock) -> None:
    packer = _packer(cpu=15.0)
    packer.pool.acquire()
    for seconds in (30.0, 10.0, 10.0):
        _run(packer, clock, seconds)
    assert packer.tick([_rt(packer.pool.slots[0], 16, clock.now)]) is False
    assert "host CPU" in (packer.levels[0].held or "")
    packer.close()  # the final levels and why each stopped there
    level = packer.study.user_attrs["hpo.packing.h"]["levels"][0]
    assert "host CPU" in level["held"] and level["cpu_cores"] == 15.0 and level["util"] == 20.0
    assert level["held_by"] == "cpu"  # the low_gpu_util finding's advice follows it
