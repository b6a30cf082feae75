"""The first wave's "ready" (scheduler/_workers.py ``starting``): a worker that said ready is
no longer starting, so the run's wait for its first wave ends at once, not after
_FIRST_WAVE_WAIT_S (30 s); a worker that says anything else first broke the protocol and is
replaced. Fake channels and processes: no study runs here (the whole run is in
tests/scheduler/test_first_wave.py)."""

from __future__ import annotations

from typing import Any

from hpo_orchestrator.scheduler._trial import Worker
from hpo_orchestrator.scheduler._workers import Workers


class _Channel:
    """What Workers reads of a worker's channel: pending() and receive()."""

    def __init__(self, *messages: tuple[Any, ...]) -> None:
        self.inbox = list(messages)

    def pending(self) -> bool:
        return bool(self.inbox)

    def receive(self) -> list[tuple[Any, ...]]:
        out, self.inbox = self.inbox, []
        return out


class _Process:
    pid = 999_999_999

    def poll(self) -> int | None:
        return None  # alive


def _worker(channel: _Channel) -> Worker:
    return Worker(process=_Process(), connection=channel, log=None,  # type: ignore[arg-type]
                  cuda_visible_devices="", prepared=True, starting=True)


def _workers(**idle: Worker) -> tuple[Workers, list[int]]:
    workers = Workers(slots=None, running={}, kill_grace_s=1.0, icd_env={})  # type: ignore[arg-type]
    retired: list[int] = []
    workers.retire = lambda worker, slot_id, keep_lease=False: retired.append(slot_id)  # type: ignore[method-assign]
    workers.idle = {int(k.removeprefix("s")): w for k, w in idle.items()}
    return workers, retired


def test_a_worker_that_said_ready_is_no_longer_starting() -> None:
    """Read once, recorded: the next look (the wait loop's next turn) no longer lists it, and
    it stays the slot's idle worker for the first trial."""
    quiet, ready = _worker(_Channel()), _worker(_Channel(("ready",)))
    workers, retired = _workers(s0=quiet, s1=ready)
    assert workers.starting() == [quiet]  # ready's message read now
    assert ready.starting is False and workers.idle[1] is ready
    quiet.connection.inbox.append(("ready",))  # type: ignore[attr-defined]
    assert workers.starting() == []  # the wait ends: both ready
    assert workers.starting() == [] and retired == []
    assert workers.idle == {0: quiet, 1: ready}


def test_a_worker_that_says_anything_else_is_replaced() -> None:
    """Not ("ready",): a thread of its setup wrote on the channel; it retires (its slot's
    lease kept for the trial) and the run waits for it no longer."""
    odd, fine = _worker(_Channel(("report", 1, 0.5))), _worker(_Channel(("ready",)))
    workers, retired = _workers(s0=odd, s1=fine)
    assert workers.starting() == []
    assert retired == [0] and workers.idle == {1: fine}


def test_an_idle_worker_that_said_ready_and_writes_again_is_replaced() -> None:
    """After its ready, an idle worker must stay silent: a second message replaces it at its
    trial (Workers.for_trial asks _wrote_while_idle)."""
    worker = _worker(_Channel(("ready",)))
    workers, _ = _workers(s0=worker)
    assert workers.starting() == []
    assert workers._wrote_while_idle(worker) is False
    worker.connection.inbox.append(("ready",))  # type: ignore[attr-defined]
    assert workers._wrote_while_idle(worker) is True


# --- a start-up that outlasted the wait, as status and the progress show it (issue 28, item 6)

def test_status_says_setup_still_running_for_a_trial_whose_worker_starts_up(tmp_path: Any) -> None:
    import optuna

    from tests.conftest import run_cli

    storage = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = optuna.create_study(study_name="hpo", storage=storage)
    trial = study.ask()
    for key, value in {"hpo.host": "h", "hpo.orchestrator_pid": 1, "hpo.slot": 0,
                       "hpo.setup_running": True}.items():
        trial.set_user_attr(key, value)
    study._storage.record_heartbeat(trial._trial_id)  # type: ignore[attr-defined]
    result = run_cli(tmp_path, "status")
    assert result.code == 0, result.stderr
    assert "setup still running" in result.stdout, result.stdout
    assert "outside" not in result.stdout


def test_the_progress_says_setup_still_running_while_the_first_wave_starts_up() -> None:
    from rich.console import Console

    from hpo_orchestrator.cli._progress import LiveReporter

    console = Console(record=True, width=200)
    reporter = LiveReporter(console, n_trials=4, already_done=0, direction="minimize")
    reporter.setting_up(2, 12.0)
    console.print(reporter._render())
    assert "setup still running: 2 worker(s)" in console.export_text()


# --- the wait is no stall of the loop (issue 28, item 6) -----------------------------------------

def test_the_first_waves_wait_is_not_given_back_to_the_trials_as_a_stall(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The loop gives a round that stood still (SIGSTOP) back to the running trials, their
    timeouts moved by it (scheduler/_deadlines.py LoopClock). The first wave's wait before
    the loop is no such stall: a trial handed over after a 5 s wait keeps its clock, so a
    hanging setup is stopped at trial_timeout_s, not 5 s past it. The run's steps around
    the loop are stubbed and the loop's clock is a counter the test moves (events, not the
    wall clock: tests/scheduler/test_first_wave.py runs the whole study)."""
    from types import SimpleNamespace

    from hpo_orchestrator.scheduler import _deadlines, orchestrator
    from hpo_orchestrator.scheduler._recipe import Duty

    now = [1000.0]
    monkeypatch.setattr(_deadlines, "time", SimpleNamespace(monotonic=lambda: now[0]))
    for step in ("ensure_run_dir", "sweep_left_behind", "restore_subreaper"):
        monkeypatch.setattr(orchestrator, step, lambda *_: None)
    monkeypatch.setattr(orchestrator, "become_subreaper", lambda: None)

    trial = SimpleNamespace(paused_s=0.0, kill_at=None)  # handed over after the wave
    given: list[float] = []
    run: Any = orchestrator.Orchestrator.__new__(orchestrator.Orchestrator)
    run.clock = _deadlines.LoopClock(0.1)  # made with the orchestrator, before the wave
    run.__dict__.update(
        log_dir=None, auto=None, sampler=None, _signals=0, halted=None,
        recovery=SimpleNamespace(reap=lambda: None),
        records=SimpleNamespace(record_devices=lambda _: None),
        slots=SimpleNamespace(slots=[]), deadline=SimpleNamespace(start=lambda: None),
        failures=SimpleNamespace(at_end=lambda: None),
        _start_first_wave=lambda: now.__setitem__(0, now[0] + 5.0),  # the workers' 5 s setup
        _duties=lambda: [Duty("stall clock", lambda: given.append(
                             run.clock.discount_stall([trial]))),
                         Duty("done", lambda: True, ends_loop=True)],
        _watch_storage=lambda force=False: None, _wind_down=lambda *_: None)
    assert run._run() == orchestrator.EXIT_OK
    assert given == [0.0] and trial.paused_s == 0.0
    # a real stall once the loop runs is still given back: the clock itself works
    now[0] += 5.0
    assert run.clock.discount_stall([trial]) > 4.0 and trial.paused_s > 4.0
