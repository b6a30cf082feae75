"""Status gives the database's numbers whichever tally it folds into: the study's kept tally
(the trials since it folded into a copy), or a fresh one that every trial is folded into where
it cannot trust the kept one, whoever ended the trials: the orchestrator, plain Optuna (``tell``
from another process, ``add_trial``), or a reaper. The numbers are held to a visit of every
trial (tests/status_visit.py).

Each comparison freezes the clock (running trials end "now") and compares the JSON of the
reports: equal, but for sums, which may differ in their last bits (another summing order).
"""

from __future__ import annotations

import random
import sqlite3
import statistics
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

import hpo_orchestrator.db as db
from hpo_orchestrator.db import connect, tables
from hpo_orchestrator.status import _collect
from hpo_orchestrator.status._collect import _kept_tally, _median
from hpo_orchestrator.tally._tally import Tally, advance
from tests import status_visit
from tests.conftest import run_cli
from tests.status.test_status_numbers import _study
from tests.status_visit import visit

TARGET = "objective.target=tests.objectives:"


def _same(full: Any, kept: Any, path: str = "") -> None:
    if isinstance(full, dict) and isinstance(kept, dict):
        assert full.keys() == kept.keys(), path
        for key in full:
            _same(full[key], kept[key], f"{path}.{key}")
    elif isinstance(full, list) and isinstance(kept, list):
        assert len(full) == len(kept), path
        for i, (a, b) in enumerate(zip(full, kept, strict=True)):
            _same(a, b, f"{path}[{i}]")
    elif isinstance(full, float) and isinstance(kept, float):
        assert kept == pytest.approx(full, rel=1e-12, abs=1e-12), path
    else:
        assert kept == full, path


def _compare(url: str, study: str, monkeypatch: pytest.MonkeyPatch,
             kept_expected: bool = True, read_from_tally: bool | None = None) -> Tally | None:
    """The study's report (through SQLAlchemy, and through sqlite3 as status --json reads it),
    and the fresh fold of every trial, each against a visit of every trial; the kept tally
    status trusted (None: it folded into a fresh one). ``read_from_tally``: whether the kept
    tally answered (default: when trusted; a trial since it that it cannot place makes status
    fold into a fresh one)."""
    now = datetime.now().timestamp()
    monkeypatch.setattr(_collect.time, "time", lambda: now)
    monkeypatch.setattr(status_visit.time, "time", lambda: now)
    answered: list[bool] = []  # per report: whether a kept tally (watermark > 0) answered
    report = _collect._report

    def spied(*args: Any, plain: Any = None) -> Any:
        made = report(*args, plain=plain)
        if args[-1].watermark and plain is None:
            answered.append(made is not None)
        return made

    monkeypatch.setattr(_collect, "_report", spied)
    engine = connect.create_engine(url)
    try:
        with engine.connect() as connection:
            study_id, _ = db.study_id_of(connection, study)
            tally = _kept_tally(connection, study_id, study)
            assert (tally is not None) == kept_expected
            full = visit(connection, study).to_json()
            _same(full, _collect.collect(connection, study).to_json())
            with monkeypatch.context() as fresh:  # the fold of every trial, kept tally or not
                fresh.setattr(_collect, "_kept_tally", lambda *_: None)
                _same(full, _collect.collect(connection, study).to_json())
    finally:
        engine.dispose()
    answered.clear()
    with closing(db.open_sqlite(url)) as plain:  # status --json's path: sqlite3, no SQLAlchemy
        lite = _collect.collect_status_sqlite(plain, study)
    _same(full, lite.to_json())
    assert (answered[:1] == [True]) == (kept_expected if read_from_tally is None else read_from_tally)
    return tally


def _advance(url: str, study: str = "big", rebuild: bool = False) -> None:
    engine = connect.create_engine(url, read_only=False)
    tables.ensure_tables(engine)
    with engine.begin() as connection:
        study_id, _ = db.study_id_of(connection, study)
        advance(connection, study_id, study, rebuild=rebuild)
    engine.dispose()


@pytest.mark.parametrize("summarized", [0, 41])
def test_tally_then_trials_told_by_optuna(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          summarized: int) -> None:
    """Summarized, foreign and running trials; then plain Optuna ends the running one, asks
    and tells more, adds one with old dates: read before and after the next trial's end."""
    url = _study(tmp_path / "s.db", summarized)
    _compare(url, "big", monkeypatch, kept_expected=False)  # no tally: a fresh fold
    _advance(url)  # only a run's start builds it
    _compare(url, "big", monkeypatch, kept_expected=False)
    _advance(url, rebuild=True)
    tally = _compare(url, "big", monkeypatch)
    assert tally is not None and tally.folded == summarized + 3 and len(tally.holes) == 1

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="big", storage=url)
    running = next(t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING)
    study.tell(running.number, 0.01)  # ends the hole: folded once, not twice
    for i in range(4):
        trial = study.ask()
        trial.set_user_attr("hpo.host", "h1")
        trial.set_user_attr("hpo.gpu_index", 1)
        if i == 3:
            break  # left running
        study.tell(trial, i if i != 1 else None, state=TrialState.FAIL if i == 1 else None)
    _compare(url, "big", monkeypatch)  # the tally, and these trials read one by one
    _advance(url)
    tally = _compare(url, "big", monkeypatch)
    assert tally is not None and tally.folded == summarized + 3 + 1 + 3
    with sqlite3.connect(tmp_path / "s.db") as con:  # each folded trial has its summary row
        assert con.execute("SELECT COUNT(*) FROM hpo_trial_summary").fetchone()[0] == tally.folded
    _advance(url)  # nothing new: nothing changes
    assert _compare(url, "big", monkeypatch) == tally


def test_folds_afresh_when_the_tally_does_not_match(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url = _study(tmp_path / "s.db", 30)
    _advance(url, rebuild=True)
    _compare(url, "big", monkeypatch)
    with sqlite3.connect(tmp_path / "s.db") as con:  # a summary row gone: the counts differ
        con.execute("DELETE FROM hpo_trial_summary WHERE number = 3")
    _compare(url, "big", monkeypatch, kept_expected=False)
    _advance(url, rebuild=True)  # a rebuild folds it in again, from its attrs
    _compare(url, "big", monkeypatch)


def test_a_trial_started_before_a_devices_frontier_is_folded_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna's add_trial can write a finished trial with any dates: on a device whose early
    busy time was summed away, the tally cannot place it, and says so."""
    url = _study(tmp_path / "s.db", 30)
    _advance(url, rebuild=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="big", storage=url)
    running = next(t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING)
    study.tell(running.number, 0.5)
    _advance(url)  # no hole left: each device's early segments are summed away
    old = datetime.now() - timedelta(days=3)
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.3,
                                              user_attrs={"hpo.host": "h0", "hpo.gpu_index": 0}))
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(
            "UPDATE trials SET datetime_start = :a, datetime_complete = :b WHERE number = :n"),
            {"a": old, "b": old + timedelta(seconds=5), "n": len(study.trials) - 1})
    engine.dispose()
    _compare(url, "big", monkeypatch, read_from_tally=False)  # read: a fresh fold answers
    _advance(url)
    _compare(url, "big", monkeypatch, kept_expected=False)  # folded: the tally is not exact
    _advance(url, rebuild=True)
    _compare(url, "big", monkeypatch)


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_best_follows_the_direction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    direction: str) -> None:
    """The best trial of a single-objective study is its highest value when it maximizes, its
    lowest when it minimizes: from the kept tally as from a visit of every trial, folded in by
    ``advance`` and read since it (trials told after the tally), ties to the lowest number."""
    url = _study(tmp_path / "s.db", 30, direction=direction)
    _advance(url, rebuild=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="big", storage=url)
    pick = max if direction == "maximize" else min

    def expected() -> tuple[float, int]:
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        value = pick(t.value for t in complete)
        return value, min(t.number for t in complete if t.value == value)

    for step in range(3):
        now = datetime.now().timestamp()
        monkeypatch.setattr(_collect.time, "time", lambda now=now: now)
        monkeypatch.setattr(status_visit.time, "time", lambda now=now: now)
        engine = connect.create_engine(url)
        with engine.connect() as connection:
            kept = _collect.collect(connection, "big")
            full = visit(connection, "big")
        engine.dispose()
        assert _tally_of_url(url) is not None  # the kept tally answered, not a fresh fold
        value, number = expected()
        assert (kept.best["value"], kept.best["number"]) == (value, number), step
        assert (full.best["value"], full.best["number"]) == (value, number), step
        # Next: a new best and a tie of it, told by Optuna (read since the tally), then folded in.
        better = value + 1 if direction == "maximize" else value - 1
        study.tell(study.ask(), better)
        study.tell(study.ask(), better)
        worse = value - 5 if direction == "maximize" else value + 5
        study.tell(study.ask(), worse)
        if step == 1:
            _advance(url)


def _tally_of_url(url: str) -> Tally | None:
    engine = connect.create_engine(url)
    try:
        with engine.connect() as connection:
            study_id, _ = db.study_id_of(connection, "big")
            return _kept_tally(connection, study_id, "big")
    finally:
        engine.dispose()


def test_a_trial_asked_ahead_is_queued_not_running(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial asked ahead of a free slot (RUNNING to Optuna, no hpo.slot yet) is QUEUED in
    status, from the kept tally as from a visit of every trial, and on no device."""
    url = _study(tmp_path / "s.db", 30)
    _advance(url, rebuild=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="big", storage=url)
    study.set_user_attr("hpo.config", {"study": {"n_trials": 40}})  # run by the orchestrator
    ahead = study.ask()
    ahead.set_user_attr("hpo.host", "h0")
    _compare(url, "big", monkeypatch)
    engine = connect.create_engine(url)
    with engine.connect() as connection:
        kept = _collect.collect(connection, "big")
    engine.dispose()
    assert _tally_of_url(url) is not None
    assert (kept.states["RUNNING"].count, kept.states["QUEUED"].count) == (1, 1)
    assert kept.queued == [ahead.number]
    assert [r["number"] for r in kept.running] != [ahead.number]


@pytest.mark.parametrize("seed", range(40))
def test_median_reads_few_stored_values(seed: int) -> None:
    rng = random.Random(seed)
    stored = sorted(rng.choice([rng.random(), 0.5]) for _ in range(rng.randint(0, 30)))
    extra = [rng.choice([rng.random(), 0.5]) for _ in range(rng.randint(0 if stored else 1, 6))]
    reads = []

    def window(offset: int, limit: int) -> list[float]:
        reads.append(limit)
        return stored[offset:offset + limit]

    assert _median(window, len(stored), extra) == statistics.median(stored + extra)
    assert sum(reads) <= len(extra) + 2


@pytest.mark.slow
def test_orchestrator_optuna_and_reaper_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run keeps the tally; trials ended by plain Optuna and a trial reaped as lost
    are read one by one, then folded in by the next run's trials."""
    args = ("run", "objective=custom", TARGET + "quadratic", "pruner=none", "scheduler.parallel=2",
            "scheduler.gpus=none", "telemetry.enabled=false", f"scheduler.lease_dir={tmp_path / 'l'}")
    first = run_cli(tmp_path, *args, "study.n_trials=12")
    assert first.code == 0, first.stderr
    url = f"sqlite:///{first.db}"
    tally = _compare(url, "hpo", monkeypatch)
    assert tally is not None and tally.folded == 12

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="hpo", storage=url)
    study.tell(study.ask({"x": optuna.distributions.FloatDistribution(-10, 10)}), 3.0)
    study.tell(study.ask(), state=TrialState.FAIL)
    lost = study.ask()  # an orchestrator elsewhere that died: no heartbeat, started long ago
    lost.set_user_attr("hpo.host", "elsewhere")
    lost.set_user_attr("hpo.pid", 1)  # a slot took it (else it never ran: back to the queue)
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE trials SET datetime_start = :a WHERE number = :n"),
                           {"a": datetime.now() - timedelta(hours=2), "n": lost.number})
    engine.dispose()
    _compare(url, "hpo", monkeypatch)

    second = run_cli(tmp_path, *args, "study.add_trials=3")
    assert second.code == 0, second.stderr
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert trials[lost.number].state == TrialState.FAIL
    assert trials[lost.number].user_attrs["hpo.fail_reason"] == "lost"
    tally = _compare(url, "hpo", monkeypatch)
    finished = [t for t in trials.values() if t.state.is_finished()]
    assert tally is not None and tally.folded == len(finished) and not tally.holes


def test_failures_count_the_trials_that_ran_and_failed(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """After a Ctrl-C: four trials ran and were interrupted, one asked ahead was put back
    before any slot took it (no hpo.pid). "+N attempts re-run" and "failures by reason" count
    the four, as the run's progress did; a COMPLETE and a PRUNED trial on which another client
    wrote an hpo.fail_reason are no failures. Alike from the full visit and the kept tally."""
    from rich.console import Console

    from hpo_orchestrator.status import print_status

    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=url, study_name="big")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}

    def add(state: TrialState, attrs: dict[str, Any]) -> None:
        study.add_trial(optuna.trial.create_trial(
            state=state, value=0.5 if state == TrialState.COMPLETE else None, params={"x": 0.5},
            distributions=dist, user_attrs={"hpo.host": "h0", "hpo.gpu_index": None, **attrs}))

    for pid in (11, 12, 13, 14):
        add(TrialState.FAIL, {"hpo.pid": pid, "hpo.fail_reason": "interrupted",
                              "hpo.error": "stopped by SIGINT/SIGTERM/SIGHUP", "hpo.retried": True})
    add(TrialState.FAIL, {"hpo.fail_reason": "interrupted", "hpo.retried": True,
                          "hpo.error": "stopped before a slot took it"})
    add(TrialState.FAIL, {"hpo.pid": 15, "hpo.fail_reason": "exception",
                          "hpo.error": "ValueError: bad"})
    add(TrialState.COMPLETE, {"hpo.pid": 16, "hpo.fail_reason": "exception"})
    add(TrialState.PRUNED, {"hpo.pid": 17, "hpo.fail_reason": "oom"})
    for rebuild in (None, True):
        if rebuild:
            _advance(url, rebuild=True)
        _compare(url, "big", monkeypatch, kept_expected=bool(rebuild),
                 read_from_tally=bool(rebuild))
        engine = connect.create_engine(url)
        with engine.connect() as connection:
            report = _collect.collect(connection, "big")
        engine.dispose()
        assert (report.retried, report.never_ran) == (4, 1)
        assert report.fail_reasons == {"exception": 1, "interrupted": 4}
        failing = [f for f in report.findings if f.code == "failing_trials"]
        assert failing and failing[0].evidence["failed"] == 1
        console = Console(width=200, record=True)
        print_status(report, console)
        text = console.export_text()
        assert "finished 3 (+4 attempts re-run: interrupted or retried)" in text  # 8 - 4 - 1
        assert "failures by reason: exception: 1, interrupted: 4" in text
