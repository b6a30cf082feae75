"""The packer's turn (placement/_packer.py), from its promises: a decision at most every
second, reading the running trials only then; each GPU's numbers since its level was set
(memory of the last 30 s, the host's cores since the trials' set-up), each trial's on its own
GPU only; the running trials' peaks as the next trial's until one finished; groups decided in
turn, each seeing the trials the last one added; the changes timed in UTC and said once per
group; a held reason written at once but not rewritten unchanged; the level an earlier run
settled at, per GPU model; a raise that waits for cores is made as decided. Written for the
mutants mutmut found unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import optuna
import pytest

from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement import Packer, RunningView, _packer
from hpo_orchestrator.placement._rules import GpuLevel
from hpo_orchestrator.telemetry._sampler import DeviceReading
from tests.placement.test_packer import _Clock, packer_of
from tests.placement.test_packer_host import _Study

AUTO = ["scheduler.parallel=auto", "scheduler.host_cores=16"]
TOTAL_MIB = 80_000.0


def _gpu(index: int, name: str = "fake") -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", name=name, memory_total_mib=TOTAL_MIB)


class _Sampler:
    """The telemetry sampler, scripted per GPU (five readings up to now), every question asked
    of it recorded with its ``since``."""

    def __init__(self, clock: _Clock, util: float = 20.0, free_mib: float = 70_000.0,
                 cpu: float | None = 2.0, cpu_rounds: int = 5,
                 peaks: dict[int, list[float]] | None = None) -> None:
        self.clock = clock
        self.util: dict[int, float] = {}  # per GPU; else ``default_util``
        self.default_util, self.free_mib = util, free_mib
        self.cpu, self.cpu_rounds = cpu, cpu_rounds
        self.peaks = peaks or {}
        self.asked: list[tuple[Any, ...]] = []

    def device_readings(self, gpu_index: int, since: float) -> list[DeviceReading]:
        self.asked.append(("device", gpu_index, since))
        util = self.util.get(gpu_index, self.default_util)
        return [DeviceReading(self.clock.now - k, util, TOTAL_MIB - self.free_mib)
                for k in range(4, -1, -1)]

    def cpu_readings(self, since: float) -> list[float]:
        self.asked.append(("cpu", since))
        return [] if self.cpu is None else [self.cpu] * self.cpu_rounds

    def running_mem_peaks(self, gpu_index: int) -> list[float]:
        return list(self.peaks.get(gpu_index, ()))


@pytest.fixture(autouse=True)
def _no_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_packer, "detect_mps", lambda: {"active": False})


def _view(gpu: int, clock: _Clock, pid: int, threads: int = 8, **kw: Any) -> RunningView:
    return RunningView(gpu=gpu, worker=pid, started=clock.now, threads=threads,
                       params={"kind": "lightgbm"}, choices={"kind": 2}, **kw)


def _end(packer: Packer, clock: _Clock, gpu: int, seconds: float, pid: int,
         fail: str | None = None, kind: str = "lightgbm") -> None:
    """A trial of ``seconds`` on ``gpu`` by worker ``pid``, from now; 1000 MiB its peak."""
    view = replace(_view(gpu, clock, pid), params={"kind": kind})
    clock.now += seconds
    packer.trial_ended(view, fail, 1000.0)


def _measure_level_one(packer: Packer, clock: _Clock, gpus: tuple[int, ...]) -> None:
    """On each GPU a busy place and its worker's trials: a warm-up (left out), then 10 s ones,
    two measured trials in all per group."""
    for _gpu in gpus:
        packer.pool.acquire()
    for gpu in gpus:
        _end(packer, clock, gpu, 30.0, pid=100 + gpu)
        for _ in range(2 // len(gpus)):
            _end(packer, clock, gpu, 10.0, pid=100 + gpu)


# --- when it decides, and on what ------------------------------------------------------------

def test_a_decision_is_due_every_second_and_only_then_reads_the_running_trials(
        clock: _Clock) -> None:
    read: list[float] = []

    def running() -> Iterator[RunningView]:
        read.append(clock.now)
        yield from ()

    packer = packer_of([_gpu(0)], AUTO, _Sampler(clock))
    clock.now += 0.5
    assert packer.tick(running()) is False and read == []
    clock.now += 0.5  # one second after the packer's start, its first decision
    packer.tick(running())
    assert read == [clock.now]
    fixed = packer_of([_gpu(0)], ["scheduler.parallel=1"], _Sampler(clock))
    clock.now += 5.0
    assert fixed.tick(running()) is False and read == [clock.now - 5.0]  # fixed levels: never


def test_a_gpus_numbers_are_read_since_its_level_was_set(clock: _Clock) -> None:
    """Utilization since the level was set (the run's start), memory of the last 30 s, the
    host's cores since every running trial reported its first step (its set-up behind it; a
    trial that ended is not waited for); a new trial's threads on the cores of the last 10 s."""
    sampler = _Sampler(clock)
    packer = packer_of([_gpu(0)], AUTO, sampler)
    start = clock.now
    reported = replace(_view(0, clock, pid=1), reports=((1, 0.25),))
    ended = _view(0, clock, pid=2, ended=True)  # no report: it ended in its set-up
    clock.now += 1.0
    packer.tick([reported, ended])
    assert ("device", 0, start) in sampler.asked
    assert ("device", 0, clock.now - 30.0) in sampler.asked
    assert ("cpu", start + 0.25) in sampler.asked
    sampler.asked.clear()
    packer.threads_for_next([])
    assert sampler.asked == [("cpu", clock.now - 10.0)]


def test_the_cores_used_count_from_min_readings_rounds() -> None:
    """Three rounds (min_readings) of 2 cores: a trial holding 16 threads leaves 14 free."""
    clock = _Clock()
    packer = packer_of([_gpu(0)], AUTO, _Sampler(clock, cpu_rounds=3))
    assert packer.threads_for_next([_view(0, clock, pid=1, threads=16)]) == 14


def test_a_packer_without_readings_decides_on_what_it_has(clock: _Clock) -> None:
    packer = packer_of([_gpu(0)], AUTO, None)
    packer.pool.acquire()
    clock.now += 10.0  # a held reason is written from 10 s after the start's write
    assert packer.tick([]) is False
    assert packer.levels[0].held == "measuring utilization"
    level = packer.study.user_attrs["hpo.packing.h"]["levels"][0]
    assert (level["held"], level["util"], level["cpu_cores"]) == ("measuring utilization", None, None)
    assert packer.threads_for_next([]) == 16


def test_until_a_trial_finished_the_running_trials_peaks_are_the_next_trials(
        clock: _Clock) -> None:
    """Two trials running at 1000 and 3000 MiB: the next one is expected at 3000 (4262 MiB
    with margin and reserve), and the first may still grow by 2000 MiB of the 6000 free."""
    packer = packer_of([_gpu(0)], AUTO, _Sampler(clock, free_mib=6000.0, peaks={0: [1000.0, 3000.0]}))
    packer.pool.acquire()
    clock.now += 1.0
    packer.tick([])
    assert packer.levels[0].held == ("GPU memory: 4000 MiB free, a trial needs 4262 MiB (peak "
                                     "3000 MiB x 1.25 + 512)")


def test_each_gpu_is_judged_on_its_own_running_trials(clock: _Clock) -> None:
    """GPU 0 (one model) runs a trial past two steps, at 20 %: it goes to 80 / 20 = 4 per GPU
    at once. GPU 1 (another model) runs one still in its set-up (no step): no first level
    there, and its set-up does not hold GPU 0's."""
    sampler = _Sampler(clock, peaks={0: [1000.0], 1: [1000.0]})
    packer = packer_of([_gpu(0, "A"), _gpu(1, "B")], AUTO, sampler)
    packer.pool.acquire(), packer.pool.acquire()
    stepping = replace(_view(0, clock, pid=1), reports=((1, 1.0), (2, 2.0)))
    setting_up = _view(1, clock, pid=2)
    done_on_0 = _view(0, clock, pid=3, ended=True)  # its result in, its slot not yet handed on
    clock.now += 3.0
    assert packer.tick([stepping, setting_up, done_on_0]) is True
    assert packer.pool.limits == {0: 4, 1: 1}


def test_a_failed_trial_measures_nothing(clock: _Clock) -> None:
    packer = packer_of([_gpu(0)], AUTO, _Sampler(clock))
    packer.pool.acquire()
    _end(packer, clock, 0, 30.0, pid=1)
    _end(packer, clock, 0, 10.0, pid=1)
    _end(packer, clock, 0, 10.0, pid=1, fail="error")
    assert packer.tick([]) is False
    assert packer.levels[0].held == "measuring trial durations at 1 per GPU (1 of 2)"


# --- what it says and writes ----------------------------------------------------------------

def test_changes_are_timed_in_utc_kept_and_said_once_per_group(clock: _Clock) -> None:
    """Two GPUs of one model move as one: each change is kept for each GPU, with its time in
    UTC; the progress gets one line per group's change, every change since it last asked."""
    packer = packer_of([_gpu(0), _gpu(1)], AUTO, _Sampler(clock))
    _measure_level_one(packer, clock, (0, 1))
    assert packer.tick([]) is True and packer.pool.limits == {0: 2, 1: 2}
    clock.now += 2.0
    _end(packer, clock, 0, 5.0, pid=100, fail="oom")
    assert packer.pool.limits == {0: 1, 1: 1}
    assert packer.take_notes() == [
        "gpu0, gpu1: 1 -> 2 trials per GPU (20% utilization < 80% at 1 per GPU (6.0 trials/min))",
        "gpu0, gpu1: 2 -> 1 trials per GPU (a trial ran out of GPU memory at 2 per GPU)"]
    entry = packer.study.user_attrs["hpo.packing.h"]
    assert [(c["gpu"], c["from"], c["to"]) for c in entry["changes"]] == [
        (0, 1, 2), (1, 1, 2), (0, 2, 1), (1, 2, 1)]
    for change in entry["changes"]:
        assert datetime.fromisoformat(change["time"]).utcoffset() == timedelta(0)
    assert [level["gpu"] for level in entry["levels"]] == [0, 1]
    assert packer.levels[1].times[1] == {"kind=lightgbm": (10.0, 10.0)}  # its kind, not pooled


def test_groups_decide_in_turn_each_seeing_the_trials_the_last_one_added(clock: _Clock) -> None:
    """Two GPU models, each measured at one per GPU: with room for four trials both go up in
    one turn (both changes kept); with scheduler.parallel=3 the second sees the first one's
    third trial and is held."""
    both = packer_of([_gpu(0, "A"), _gpu(1, "B")], [*AUTO, "scheduler.parallel=4",
                                                   "scheduler.trials_per_gpu=auto"], _Sampler(clock))
    _measure_level_one(both, clock, (0,))
    _measure_level_one(both, clock, (1,))
    assert both.tick([]) is True and both.pool.limits == {0: 2, 1: 2}
    assert [c["gpu"] for c in both.study.user_attrs["hpo.packing.h"]["changes"]] == [0, 1]
    capped = packer_of([_gpu(0, "A"), _gpu(1, "B")], [*AUTO, "scheduler.parallel=3",
                                                     "scheduler.trials_per_gpu=auto"], _Sampler(clock))
    _measure_level_one(capped, clock, (0,))
    _measure_level_one(capped, clock, (1,))
    assert capped.tick([]) is True and capped.pool.limits == {0: 2, 1: 1}
    assert capped.levels[1].held == "at scheduler.parallel=3 trials on this host"


def test_a_group_needs_cores_for_one_more_trial_on_each_gpu(clock: _Clock) -> None:
    """Two GPUs of one model, their two trials using 8 of 16 cores: 85 % of the cores carry
    three such trials, not the four a step up of the group makes."""
    packer = packer_of([_gpu(0), _gpu(1)], AUTO, _Sampler(clock, cpu=8.0))
    clock.now += 1.0
    assert packer.tick([]) is False
    assert packer.levels[0].held == ("host CPU: the running trials use 8.0 of 16 cores (2 more "
                                     "would pass 85% of them)")


def test_a_changed_held_reason_is_written_every_10_s_an_unchanged_one_never(
        clock: _Clock) -> None:
    """hpo.packing.<host> is written as the run starts; a changed held reason alone (here GPU
    0's, the other GPU's unchanged) from 10 s after the last write on; an unchanged one never."""
    study = _Study({})
    packer = packer_of([_gpu(0, "A"), _gpu(1, "B")], AUTO, _Sampler(clock, util=95.0),
                       study)  # type: ignore[arg-type]
    assert len(study.written) == 1  # the run's start
    clock.now += 1.0
    packer.tick([])  # both held now ("0 of its 1 places busy"): a second after the write
    assert len(study.written) == 1
    packer.pool.acquire()  # GPU 0 busy: held by its utilization
    clock.now += 9.0
    packer.tick([])
    assert len(study.written) == 2
    assert [lv["held"] for lv in study.user_attrs["hpo.packing.h"]["levels"]] == [
        "95% utilization >= scheduler.target_gpu_util=80", "0 of its 1 places busy"]
    clock.now += 11.0
    packer.tick([])
    assert len(study.written) == 2


def test_the_attr_shows_the_gains_and_the_last_readings_rounded(clock: _Clock) -> None:
    """Started at two per GPU where an earlier run settled (level one measured at 10 s), two
    trials of 11 s: 1.82x, shown under "gains" by level; the utilization and the cores of the
    last decision to a tenth."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    _earlier_run_settled(study, {"fake": 2})
    sampler = _Sampler(clock, util=23.456, cpu=2.26)
    packer = packer_of([_gpu(0)], AUTO, sampler, study)
    packer.pool.acquire(), packer.pool.acquire()
    for seconds in (30.0, 11.0, 11.0):
        _end(packer, clock, 0, seconds, pid=1)
    packer.tick([])
    (level,) = study.user_attrs["hpo.packing.h"]["levels"]
    assert level["gains"] == {"2": 1.82}
    assert (level["util"], level["cpu_cores"]) == (23.5, 2.3)


# --- where a run starts ---------------------------------------------------------------------

def _earlier_run_settled(study: Any, levels: dict[str, int]) -> None:
    """hpo.packing.h's "settled" as a run of objective "" left it, one entry per GPU model."""
    study.set_user_attr("hpo.packing.h", {"mode": "auto", "levels": [], "changes": [], "settled": [
        {"objective": "", "gpu": name, "memory_total_mib": TOTAL_MIB, "level": level,
         "times": {"1": {"kind=lightgbm": [10.0, 10.0]}}} for name, level in levels.items()]})


@pytest.mark.parametrize("first_model", [None, 1], ids=["no entry", "settled at one"])
def test_each_gpu_model_starts_where_its_own_earlier_run_settled(
        clock: _Clock, first_model: int | None) -> None:
    """Model B settled at two per GPU; model A (the first GPU) has no entry, or one at one per
    GPU, which is nothing to start from: B starts at two all the same, says why, and its
    levels are read from the start."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    _earlier_run_settled(study, {"B": 2, **({"A": first_model} if first_model else {})})
    sampler = _Sampler(clock)
    start = clock.now
    packer = packer_of([_gpu(0, "A"), _gpu(1, "B")], AUTO, sampler, study)
    assert packer.pool.limits == {0: 1, 1: 2}
    assert packer.take_notes() == [
        "gpu1: 1 -> 2 trials per GPU (an earlier run of this study settled at 2 per GPU on B: "
        "started there, judged against that run's 1 per GPU)"]
    clock.now += 1.0
    packer.tick([])
    assert ("device", 1, start) in sampler.asked
    assert packer.levels[1].times[1] == {"kind=lightgbm": (10.0, 10.0)}  # its kind, not pooled


def test_a_spare_is_kept_where_one_more_trial_exactly_fits(clock: _Clock) -> None:
    """Trials of 1000 MiB peak: one more needs 1762 MiB; with exactly that free it fits, and
    the GPU keeps a spare worker for the place above; a MiB less, it does not."""
    for free, wanted in ((1762.0, 2), (1761.0, 1)):
        packer = packer_of([_gpu(0)], AUTO, _Sampler(clock, free_mib=free))
        packer.pool.acquire()
        _end(packer, clock, 0, 30.0, pid=1)
        packer.tick([])
        assert packer.workers_wanted() == {0: wanted}


# --- a raise that waits ---------------------------------------------------------------------

def test_a_raise_that_waited_for_cores_is_made_as_it_was_decided(clock: _Clock) -> None:
    """Decided while a 16-thread trial held the cores (their use not measured), the raise
    waits; the GPU then reads busy, but once the trial is gone the raise is made: it was
    decided on what was measured at its level."""
    sampler = _Sampler(clock, cpu=None)
    packer = packer_of([_gpu(0)], AUTO, sampler)
    packer.pool.acquire()
    for seconds in (30.0, 10.0, 10.0):
        _end(packer, clock, 0, seconds, pid=1)
    assert packer.tick([_view(0, clock, pid=1, threads=16)]) is False
    assert packer.levels[0].held_by == "cpu"
    sampler.default_util = 95.0
    clock.now += 2.0
    assert packer.tick([_view(0, clock, pid=1, threads=8)]) is True
    assert packer.pool.limits == {0: 2}


def test_with_threads_fixed_a_raise_never_waits_for_cores(clock: _Clock) -> None:
    packer = packer_of([_gpu(0)], [*AUTO, "scheduler.threads_per_trial=16"], _Sampler(clock, cpu=None))
    packer.pool.acquire()
    for seconds in (30.0, 10.0, 10.0):
        _end(packer, clock, 0, seconds, pid=1)
    assert packer.tick([_view(0, clock, pid=1, threads=16)]) is True
    assert packer.pool.limits == {0: 2}


def test_kinds_pooled_while_a_raise_waits_pool_the_waiting_level_too(clock: _Clock) -> None:
    """Past MAX_KINDS kinds every trial is one kind: the raise waiting for cores is made with
    its durations under that one kind, as the level's own."""
    packer = packer_of([_gpu(0)], AUTO, _Sampler(clock, cpu=None))
    packer.pool.acquire()
    for seconds in (30.0, 10.0, 10.0):
        _end(packer, clock, 0, seconds, pid=1)
    assert packer.tick([_view(0, clock, pid=1, threads=16)]) is False
    for kind in "abcde":
        _end(packer, clock, 0, 10.0, pid=1, kind=kind)
    clock.now += 2.0
    assert packer.tick([_view(0, clock, pid=1, threads=8)]) is True
    assert set(packer.levels[0].times[1]) == {"*"}


def test_pooled_durations_keep_every_kinds_at_every_level_and_visit() -> None:
    state = GpuLevel(gpu=0, limit=2, times={1: {"kind=a": (1.0, 2.0), "kind=b": (3.0,)}},
                     past={1: {"kind=a": (4.0,)}, 2: {"kind=a/step": (0.5,), "kind=b/step": (0.6,)}})
    pooled = _packer._pooled(state)
    assert pooled.times == {1: {"*": (1.0, 2.0, 3.0)}}
    assert pooled.past == {1: {"*": (4.0,)}, 2: {"*/step": (0.5, 0.6)}}


def test_unreadable_settled_entries_are_left_out_and_the_rest_read() -> None:
    """An entry edited by hand is skipped, not the end of the list; a GPU whose memory size is
    unknown is an entry like any other."""
    entries = [{"objective": "cnn"},
               {"objective": "cnn", "gpu": "H200", "memory_total_mib": None, "level": 3,
                "times": {"1": {"k": [1.0]}}}]
    assert _packer.read_settled(entries) == {("cnn", "H200", None): (3, {1: {"k": (1.0,)}})}


def test_the_cores_a_trial_uses_are_shared_by_the_trials_still_running(clock: _Clock) -> None:
    """Two places at two per GPU, one trial still running and two whose results are in: the
    6 cores measured are that one trial's, and 85 % of 16 cores carries two such trials, not
    a third (counted over two trials, 3 cores each, it would carry four)."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    _earlier_run_settled(study, {"fake": 2})
    packer = packer_of([_gpu(0)], AUTO, _Sampler(clock, cpu=6.0), study)
    packer.pool.acquire(), packer.pool.acquire()
    running = [_view(0, clock, pid=1), _view(0, clock, pid=2, ended=True),
               _view(0, clock, pid=3, ended=True)]
    clock.now += 1.0
    assert packer.tick(running) is False
    assert packer.levels[0].held == ("host CPU: the running trials use 6.0 of 16 cores (1 more "
                                     "would pass 85% of them)")


def test_fixed_levels_are_recorded_at_their_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two per GPU, fixed, with MPS: the entry shows each GPU at two from the start."""
    monkeypatch.setattr(_packer, "detect_mps", lambda: {"active": True, "daemons": []})
    packer = packer_of([_gpu(0), _gpu(1)], ["scheduler.trials_per_gpu=2"], None)
    entry = packer.study.user_attrs["hpo.packing.h"]
    assert entry["mode"] == "fixed"
    assert [(lv["gpu"], lv["limit"]) for lv in entry["levels"]] == [(0, 2), (1, 2)]
