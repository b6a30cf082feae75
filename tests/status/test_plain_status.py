"""Status on a study plain Optuna wrote (no summary table, no ``hpo.*`` attr): its finished
trials are folded from one narrow read a state (status/_plain.py), its unfinished ones one by
one; the numbers are held to a visit of every trial, on sqlite and PostgreSQL. A run's first
start on such a study writes the summary rows of all its trials in one batch.
"""

from __future__ import annotations

import random
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

import hpo_orchestrator.db as db
from hpo_orchestrator.db import connect, tables
from hpo_orchestrator.status import _collect, _plain
from hpo_orchestrator.tally import _tally
from tests import status_visit
from tests.db.test_db_contract import _database
from tests.tally.test_tally import _compare, _same

STUDY = "plain"
T0 = datetime(2025, 3, 1, 9, 0, 0)
FINISHED = 60


def _plain_study(url: str, odd_dates: bool = True, direction: str = "minimize",
                 unfinished: bool = True, seed: int = 0) -> None:
    """``FINISHED`` finished trials of random states, durations (to the microsecond), last
    steps and values (ties at both ends), as plain Optuna writes them, a running and a waiting
    trial (``unfinished``); ``odd_dates``: one finished trial never started, one has no end time."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = random.Random(seed)
    study = optuna.create_study(study_name=STUDY, storage=url, direction=direction)
    study.set_user_attr("owner", "someone")  # not ours: still a plain study
    dates = {}
    for number in range(FINISHED):
        state = rng.choice([TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED,
                            TrialState.FAIL])
        steps = {s: rng.random() for s in range(rng.randint(0, 6))}
        value = rng.choice([0.0, 1.0, rng.random()]) if state == TrialState.COMPLETE else None
        study.add_trial(create_trial(
            state=state, value=value, params={"x": rng.random()},
            distributions={"x": FloatDistribution(0, 1)},
            intermediate_values=steps if state != TrialState.FAIL else {},
            user_attrs={"note": number}))
        start = T0 + timedelta(seconds=rng.uniform(0, 600))
        dates[number] = (start, start + timedelta(seconds=rng.uniform(0, 90)))
    if odd_dates:
        dates[7] = (None, dates[7][1])  # failed before it started
        dates[8] = (dates[8][0], None)  # ended without an end time: it ends "now"
    if unfinished:
        study.ask().report(0.3, 2)  # running
        study.enqueue_trial({"x": 0.1})  # waiting
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as connection:
        for number, (start, end) in dates.items():
            connection.execute(sqlalchemy.text(
                "UPDATE trials SET datetime_start = :a, datetime_complete = :b WHERE number = :n"),
                {"a": start, "b": end, "n": number})
    engine.dispose()


def _folded_one_by_one(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The numbers of the trials status builds a row of, one by one."""
    built: list[int] = []
    one_by_one = _tally.from_attrs

    def counted(number: int, *args: Any) -> Any:
        built.append(number)
        return one_by_one(number, *args)

    monkeypatch.setattr(_tally, "from_attrs", counted)
    return built


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_status_of_a_plain_study_is_a_visit_of_every_trial(
        backend: str, direction: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = _folded_one_by_one(monkeypatch)
    with _database(backend, tmp_path) as url:
        _plain_study(url, direction=direction)
        if backend == "sqlite":  # SQLAlchemy, a fresh fold, and sqlite3 as status --json
            _compare(url, STUDY, monkeypatch, kept_expected=False)
        else:
            now = datetime.now().timestamp()
            monkeypatch.setattr(_collect.time, "time", lambda: now)
            monkeypatch.setattr(status_visit.time, "time", lambda: now)
            engine = connect.create_engine(url)
            with engine.connect() as connection:
                _same(status_visit.visit(connection, STUDY).to_json(),
                      _collect.collect(connection, STUDY).to_json())
            engine.dispose()
    assert set(built) == {FINISHED, FINISHED + 1}  # the running and the waiting trial


def test_a_finished_trial_without_an_end_runs_until_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no running trial to end "now", the finished one without an end time does, as in
    the trial-by-trial fold: the study's wall time runs to now."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _plain_study(url, unfinished=False)
    _compare(url, STUDY, monkeypatch, kept_expected=False)
    with closing(db.open_sqlite(url)) as connection:
        tally = _plain.PlainStudy(connection, 1, STUDY, now=2e9).tally
    assert tally.window is not None and tally.window[2] == 2e9


def test_a_plain_study_folds_no_finished_trial_one_by_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finished trials are read a column at a time; a study with any attr of ours is not
    plain (its trials may have devices) and is folded trial by trial."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _plain_study(url)
    built = _folded_one_by_one(monkeypatch)
    with closing(db.open_sqlite(url)) as connection:
        assert _plain.is_plain(connection)
        report = _collect.collect_status_sqlite(connection, STUDY)
    assert sum(s.count for s in report.states.values()) == FINISHED + 2
    assert sorted(built) == [FINISHED, FINISHED + 1]

    engine = sqlalchemy.create_engine(url)
    with engine.begin() as connection:  # as an orchestrator of ours would have written it
        connection.execute(sqlalchemy.text(
            "INSERT INTO trial_user_attributes (trial_id, key, value_json) "
            "SELECT MIN(trial_id), 'hpo.host', '\"h1\"' FROM trials"))
    engine.dispose()
    built.clear()
    with closing(db.open_sqlite(url)) as connection:
        assert not _plain.is_plain(connection)
        _collect.collect_status_sqlite(connection, STUDY)
    assert len(built) == FINISHED + 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_runs_first_start_summarizes_a_plain_study_in_one_batch(
        backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tally a run's start builds writes one summary row a finished trial, in one batch
    (one statement each was 100,000 statements on a large study), and status then reads the
    kept tally."""
    batches: list[int] = []
    write = _tally.execute_many

    def counted(connection: Any, sql: str, params: list[Any], *args: Any) -> None:
        batches.append(len(params))
        write(connection, sql, params, *args)

    monkeypatch.setattr(_tally, "execute_many", counted)
    with _database(backend, tmp_path) as url:
        _plain_study(url, odd_dates=False)
        engine = connect.create_engine(url, read_only=False)
        tables.ensure_tables(engine)
        with engine.begin() as connection:
            study_id, _ = db.study_id_of(connection, STUDY)
            _tally.advance(connection, study_id, STUDY, rebuild=True)
        with engine.connect() as connection:
            summarized = db.scalar(connection, "SELECT COUNT(*) FROM hpo_trial_summary")
            kept = _collect._kept_tally(connection, study_id, STUDY)
        engine.dispose()
    assert batches == [FINISHED] and summarized == FINISHED
    assert kept is not None and kept.folded == FINISHED


def _fold(url: str, now: float = 2e9) -> _plain.PlainStudy:
    with closing(db.open_sqlite(url)) as connection:
        study_id, _ = db.study_id_of(connection, STUDY)
        return _plain.PlainStudy(connection, study_id, STUDY, now=now)


def test_a_plain_study_without_trials_is_a_fresh_tally(tmp_path: Path) -> None:
    """Nothing to fold: the tally is a fresh one of the study's name (no trial looked at, so a
    trial made after the read is above its watermark, among the trials since)."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name=STUDY, storage=url)
    plain = _fold(url)
    assert plain.tally == _tally.Tally(study_name=STUDY)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))  # trial_id 1
    with closing(db.open_sqlite(url)) as connection:
        since = _tally.trials_since(connection, 1, plain.tally.watermark, plain.tally.holes, False)
    assert [t.trial_id for t in since] == [1]


@pytest.mark.parametrize("steps", [{0: 0.5}, {3: 0.5}, {0: 0.1, 2: 0.2}])
def test_the_largest_step_of_a_complete_trial_is_its_last_one(
        tmp_path: Path, steps: dict[int, float]) -> None:
    """COMPLETE adds its largest step, as Tally.add: 0 where a trial reported step 0 only, and a
    lone COMPLETE trial's own step."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name=STUDY, storage=url)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0, intermediate_values=steps))
    study.add_trial(create_trial(state=TrialState.PRUNED, intermediate_values={9: 0.5}))
    assert _fold(url).tally.max_complete_step == max(steps)


def test_the_durations_of_a_state_no_trial_finished_in_are_none(tmp_path: Path) -> None:
    """``ordered`` as _tally.ordered_window: a window of a state without durations is empty."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _plain_study(url, odd_dates=False)
    plain = _fold(url)
    assert plain.ordered("duration", 0, 3, state="WAITING") == []
    assert plain.ordered("duration", 0, 3, state="COMPLETE") == plain.durations["COMPLETE"][:3]


def test_no_step_of_a_complete_trial_leaves_the_largest_step_none(tmp_path: Path) -> None:
    """As Tally.add: only a COMPLETE trial that reported a step sets it."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name=STUDY, storage=url)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    assert _fold(url).tally.max_complete_step is None
