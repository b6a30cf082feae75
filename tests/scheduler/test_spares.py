"""Spare workers (trials_per_gpu=auto, reuse mode: scheduler/_workers.py): a worker started
one level above a GPU's level runs its imports and the objective's setup before any trial is
asked for it, says nothing on its pipe meanwhile, and hands its start-up output (or its
setup's failure) to its first trial."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hpo_orchestrator.config import CustomObjectiveConfig
from hpo_orchestrator.gpu import GpuInfo
from hpo_orchestrator.placement._leases import LeaseDir
from hpo_orchestrator.placement._slots import SlotPool
from hpo_orchestrator.scheduler._logs import spare_log_path
from hpo_orchestrator.scheduler._trial import Worker
from hpo_orchestrator.scheduler._workers import Workers
from hpo_orchestrator.worker import Job
from tests.conftest import trial_rows
from tests.placement.test_packer import AUTO, TARGET, _packing

OBJECTIVES = "tests.objectives"
HEADER = "this worker started up before the trial was asked"


def _objective(setup: str) -> CustomObjectiveConfig:
    return CustomObjectiveConfig(target=f"{OBJECTIVES}:pinned", setup=f"{OBJECTIVES}:{setup}")


@pytest.fixture
def workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """One GPU with three places, at level 1, leased in a folder of this test."""
    monkeypatch.setenv("HPO_TEST_SETUP_NOTES", str(tmp_path / "setups"))
    monkeypatch.setenv("HPO_TEST_STEP_S", "0.01")
    gpu = GpuInfo(index=0, uuid="GPU-0", name="fake", memory_total_mib=80_000)
    leases = LeaseDir(tmp_path / "leases")
    pool = SlotPool.of([gpu], "auto", "auto", leases=leases, max_per_gpu=3)
    found = Workers(pool, {}, kill_grace_s=5.0, icd_env={}, run_dir=tmp_path)
    yield found
    found.retire_idle()


def _setups(tmp_path: Path) -> list[int]:
    path = tmp_path / "setups"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def _run_trial(worker: Worker, number: int, log: Path) -> Any:
    """Hand the worker a trial of ``pinned`` and answer its calls; its outcome."""
    worker.connection.send(Job(trial_number=number, objective=_objective("noted_setup"),
                               reuse=True, log_path=str(log)))
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        for message in worker.connection.receive():
            if message[0] == "result":
                return message[1]
            if message[0] == "call":
                worker.connection.send(("ok", 0.5 if message[1] == "suggest_float" else None,
                                        message[4]))
        time.sleep(0.01)
    raise AssertionError("the trial did not end")


def test_a_spare_starts_up_quietly_and_its_first_trial_takes_its_output(workers: Workers,
                                                                          tmp_path: Path) -> None:
    workers.keep_spares({0: 1}, threads=1, objective=_objective("noted_setup"))
    assert list(workers.spares) == [0]  # no trial runs: the one worker wished is a spare
    spare = workers.spares[0]
    assert spare.prepared and spare.trials == 0
    _wait_for(lambda: _setups(tmp_path) == [spare.process.pid], "the spare's setup")
    # The setup's phase() comes before its note (a send is written before it returns): had it
    # been sent, it would be waiting on the pipe by now. No sleep needed, none would help.
    assert not spare.connection.pending()  # the setup's phase() was not sent: nobody reads it
    # The same wish again starts nothing more.
    workers.keep_spares({0: 1}, threads=1, objective=_objective("noted_setup"))
    assert list(workers.spares) == [0] and workers.spares[0] is spare

    slot = workers.slots.slots[0]
    taken = workers.for_trial(slot, 7, 1, 1, tmp_path / "trial-7.log")
    assert taken is spare and not workers.spares
    first = _run_trial(taken, 7, tmp_path / "trial-7.log")
    second = _run_trial(taken, 8, tmp_path / "trial-8.log")
    assert (first.kind, second.kind) == ("value", "value")
    assert _setups(tmp_path) == [spare.process.pid]  # set up once, before its first trial
    log = (tmp_path / "trial-7.log").read_text()
    assert log.index(HEADER) < log.index(f"setup ran in {spare.process.pid}")
    assert HEADER not in (tmp_path / "trial-8.log").read_text()
    assert not spare_log_path(tmp_path, 0).exists()  # taken into trial 7's log
    workers.retire(taken, slot.id)


def test_a_spare_whose_setup_failed_fails_its_first_trial_with_the_reason(
        workers: Workers, tmp_path: Path) -> None:
    workers.keep_spares({0: 1}, threads=1, objective=_objective("failing_setup"))
    worker = workers.for_trial(workers.slots.slots[0], 3, 1, 1, tmp_path / "trial-3.log")
    outcome = _run_trial(worker, 3, tmp_path / "trial-3.log")
    assert outcome.kind == "error" and outcome.fail_reason == "exception"
    assert outcome.error == "FileNotFoundError: data/train.parquet"
    assert "failing_setup" in outcome.traceback
    log = (tmp_path / "trial-3.log").read_text()
    assert HEADER in log and "loading the data" in log
    workers.retire(worker, 0)


def test_spares_past_the_wish_retire_with_their_lease_and_log(workers: Workers,
                                                              tmp_path: Path) -> None:
    workers.keep_spares({0: 3}, threads=1, objective=_objective("noted_setup"))
    assert sorted(workers.spares) == [0, 1, 2]
    leases = LeaseDir(tmp_path / "leases")
    assert set(leases.holders("GPU-0")) == {0, 1, 2}  # held host-wide: another study waits
    pids = [w.process for w in workers.spares.values()]
    workers.keep_spares({0: 2}, threads=1, objective=_objective("noted_setup"))  # level fell
    assert sorted(workers.spares) == [0, 1]
    assert set(leases.holders("GPU-0")) == {0, 1}
    assert not spare_log_path(tmp_path, 2).exists()
    workers.retire_idle()  # the study is done: the last spare goes too, killed mid-setup or not
    assert not workers.spares and not leases.holders("GPU-0")
    assert all(p.poll() is not None for p in pids)


@pytest.mark.long
@pytest.mark.slow
def test_auto_climbs_onto_spares_that_started_up_ahead(cli) -> None:  # type: ignore[no-untyped-def]
    """One fake GPU at 20 %: auto climbs (to 3, unless a loaded machine's noise or the trials'
    measured CPU use stops it at 2); the first trial on each new place runs in a spare (its
    log starts with the spare's start-up output; level 1's, in the run's first wave), and
    every worker ran the setup once."""
    result = cli("run", *AUTO, TARGET + "pinned", f"objective.setup={OBJECTIVES}:noted_setup",
                 "study.n_trials=16",
                 env={"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps({"gpus": [{"busy_util": 20}]}),
                      "HPO_TEST_STEP_S": "0.4", "HPO_TEST_SETUP_NOTES": "setups"})
    assert result.code == 0, result.stderr
    changes = [(c["from"], c["to"]) for c in _packing(result.db)["changes"]]
    # the first level: 80 / 20, capped at 3, or 2 where the trials' measured CPU use on this
    # 2-core machine leaves room for 2 only (placement/_rules.py cpu_room)
    assert changes[0] in ((1, 3), (1, 2))
    rows = sorted(trial_rows(result.db), key=lambda r: r["number"])
    run_dir = next(p for p in result.db.parent.glob("hpo-runs/*") if p.is_dir())
    first_on: dict[int, int] = {}
    for row in rows:
        first_on.setdefault(row["attrs"]["hpo.slot"], row["number"])
    assert {0, 1} <= set(first_on)
    for slot, number in first_on.items():
        log = (run_dir / f"trial-{number}.log").read_text()
        # slot 0 starts in the first wave's worker, the places above 1 on spares: each
        # started up before its trial (a worker started for its trial has no header)
        assert HEADER in log, (slot, log)
        assert "setup ran in" in log
    setups = (result.db.parent / "setups").read_text().split()
    pids = {str(row["attrs"]["hpo.pid"]) for row in rows}
    assert len(setups) == len(set(setups)) and pids <= set(setups)  # once in every worker
    assert not list(run_dir.glob("spare-slot*.log"))


def test_a_spare_is_wanted_only_where_one_more_trial_fits_and_the_level_may_rise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No spare before a trial's memory peak is known; one for the place above once it fits
    (held for the level); none on a GPU one more trial would not fit, nor after an OOM shut
    the level above."""
    from hpo_orchestrator.placement import _packer
    from tests.placement.test_packer import _Clock
    from tests.placement.test_packer_groups import _end, _fill, _Scripted
    from tests.placement.test_packer_groups import _packer as packer_of

    clock = _Clock()
    monkeypatch.setattr(_packer, "time", clock)
    readings = _Scripted(used={1: 79_500.0})  # GPU1: 500 MiB free, a trial needs 1.8 GiB
    packer = packer_of(readings, "H100", "A100")  # judged apart
    assert packer.workers_wanted() == {0: 1, 1: 1}  # nothing known about memory yet
    _fill(packer)
    for gpu in (0, 1):
        _end(packer, clock, gpu, 30.0, pid=gpu + 1)
    packer.tick([])
    assert packer.workers_wanted() == {0: 2, 1: 1}
    readings.used[0] = 79_000.0  # the spare's CUDA context and more: it stays for this level
    clock.now += 2.0
    packer.tick([])
    assert packer.workers_wanted()[0] == 2
    _end(packer, clock, 0, 5.0, pid=1, fail="oom")  # level 2 is shut for the run
    assert packer.workers_wanted()[0] == 1


@pytest.mark.parametrize(("names", "parallel", "levels"), [
    (("H100",), 2, {0: 1}),  # room for one trial more: one spare
    (("H100",), 2, {0: 2}),  # parallel reached: none, though the GPU could take a third
    (("H100", "H100"), 3, {0: 1, 1: 1}),  # one place left for two GPUs: one spare, not two
    (("H100", "A100"), 3, {0: 1, 1: 1}),  # judged apart: the same
    (("H100", "H100"), 5, {0: 2, 1: 2})])
def test_spares_never_take_workers_past_scheduler_parallel(
        monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...], parallel: int,
        levels: dict[int, int]) -> None:
    """A spare is a started-up process holding a GPU context for the place above its GPU's
    level; it may run a trial only while scheduler.parallel leaves a place. So the workers
    wanted (every place at the levels, and the spares) never exceed scheduler.parallel, and
    spares fill the room that is left, one per GPU."""
    from hpo_orchestrator.placement import _packer
    from hpo_orchestrator.placement._rules import GpuLevel
    from tests.placement.test_packer import _Clock, packer_of
    from tests.placement.test_packer_groups import _end, _fill, _gpus, _Scripted

    clock = _Clock()
    monkeypatch.setattr(_packer, "time", clock)
    packer = packer_of(_gpus(*names), [f"scheduler.parallel={parallel}",
                                       "scheduler.trials_per_gpu=auto", "scheduler.host_cores=16",
                                       "scheduler.threads_per_trial=2"], _Scripted())
    pool = packer.pool
    for gpu, level in levels.items():
        pool.set_limit(gpu, level)
    packer.levels = {g: GpuLevel(gpu=g, limit=lv, since=clock.now, ceiling=4)
                     for g, lv in levels.items()}
    _fill(packer)
    for gpu in levels:  # each GPU's trials measured: one more fits in its memory
        for _ in range(2):
            _end(packer, clock, gpu, 30.0, pid=gpu + 1)
    packer.tick([])
    for gpu, level in levels.items():  # the levels under test, whatever tick decided
        pool.set_limit(gpu, level)
        packer.levels[gpu] = GpuLevel(gpu=gpu, limit=level, since=clock.now, ceiling=4)
    wanted = packer.workers_wanted()
    at_levels = sum(levels.values())
    assert all(wanted[g] in (lv, lv + 1) for g, lv in levels.items()), wanted
    assert sum(wanted.values()) == min(parallel, at_levels + len(levels)), wanted
