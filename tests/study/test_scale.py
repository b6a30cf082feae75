"""The run loop's mirror of the study (hpo_orchestrator/study_storage.py): what samplers and
pruners read matches Optuna's storage, other processes' trials reach it, the history bound
holds, writes are durable when the call returns; and 4 orchestrators keep the budget exact.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from hpo_orchestrator.db.connect import open_rdb_storage
from hpo_orchestrator.study import MirrorStorage, TrialEnd
from tests.e2e.test_multi import _finish, _host, _trials

optuna.logging.set_verbosity(optuna.logging.WARNING)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Recording(optuna.samplers.RandomSampler):
    """A random sampler that remembers which trial numbers it was shown at each ask."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[list[int]] = []

    def sample_independent(self, study: optuna.Study, trial: Any, name: str, dist: Any) -> Any:
        self.seen.append([t.number for t in study._get_trials(deepcopy=False, use_cache=True)])
        return super().sample_independent(study, trial, name, dist)


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -1.0, 1.0)
    trial.suggest_categorical("c", ["a", "b"])
    trial.suggest_int("k", 1, 8, log=True)
    for step in range(3):
        trial.report(x * step, step)
    trial.set_user_attr("u", {"x": x})
    return x * x


def _comparable(trial: FrozenTrial) -> dict[str, Any]:
    """A FrozenTrial's fields, with NaN made comparable."""
    def fix(value: Any) -> Any:
        return "nan" if isinstance(value, float) and math.isnan(value) else value

    return {"number": trial.number, "state": trial.state, "values": trial.values,
            "start": trial.datetime_start, "complete": trial.datetime_complete,
            "params": trial.params, "distributions": trial.distributions,
            "user_attrs": trial.user_attrs, "system_attrs": trial.system_attrs,
            "steps": {k: fix(v) for k, v in trial.intermediate_values.items()},
            "id": trial._trial_id}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mirror.db'}"


def test_the_mirror_reads_what_optuna_reads(url: str) -> None:
    """Bulk SQL builds the same FrozenTrials as Optuna's ORM, odd values included."""
    plain = optuna.create_study(study_name="s", storage=url)
    plain.optimize(_objective, n_trials=6)
    odd = plain.ask()
    odd.suggest_float("x", -1.0, 1.0)
    odd.report(float("nan"), 0)
    odd.report(float("inf"), 1)
    odd.report(float("-inf"), 2)
    odd.set_user_attr("none", None)
    plain.tell(odd, float("inf"))
    plain.ask()  # left RUNNING
    plain.enqueue_trial({"x": 0.5})  # WAITING
    expected = [_comparable(t) for t in plain.get_trials()]
    mirror = MirrorStorage(open_rdb_storage(url))
    study_id = mirror.get_study_id_from_name("s")
    assert [_comparable(t) for t in mirror.get_all_trials(study_id)] == expected


def test_a_second_orchestrators_trials_reach_the_sampler(url: str) -> None:
    """Within refresh_s: not before (the mirror serves reads alone), at once after."""
    clock = _Clock()
    sampler = _Recording()
    ours = optuna.create_study(study_name="s", storage=MirrorStorage(
        open_rdb_storage(url), refresh_s=1.0, clock=clock), sampler=sampler)
    ours.optimize(_objective, n_trials=2)
    theirs = optuna.load_study(study_name="s", storage=url)
    theirs.optimize(_objective, n_trials=3)  # numbers 2, 3, 4
    ours.optimize(_objective, n_trials=1)
    assert sampler.seen[-1] == [0, 1, 5]  # stale mirror: their trials not yet read
    clock.now += 1.0
    ours.optimize(_objective, n_trials=1)
    seen = sampler.seen[-1]
    assert seen == [0, 1, 2, 3, 4, 5, 6]
    mirrored = ours._storage.get_all_trials(ours._study_id)
    assert [t.state for t in mirrored[2:5]] == [TrialState.COMPLETE] * 3
    assert mirrored[3].intermediate_values == {0: 0.0, 1: mirrored[3].params["x"],
                                               2: 2 * mirrored[3].params["x"]}


def test_a_trial_running_elsewhere_is_followed_until_it_ends(url: str) -> None:
    clock = _Clock()
    storage = MirrorStorage(open_rdb_storage(url), refresh_s=1.0, clock=clock)
    ours = optuna.create_study(study_name="s", storage=storage)
    theirs = optuna.load_study(study_name="s", storage=url)
    running = theirs.ask()
    running.suggest_float("x", 0.0, 1.0)
    clock.now += 1.0
    [seen] = storage.get_all_trials(ours._study_id)
    assert seen.state == TrialState.RUNNING
    running.report(0.25, 1)
    theirs.tell(running, 0.5)
    clock.now += 1.0
    [seen] = storage.get_all_trials(ours._study_id)
    assert seen.state == TrialState.COMPLETE and seen.value == 0.5
    assert seen.intermediate_values == {1: 0.25}


def test_writes_are_in_the_database_when_the_call_returns(url: str) -> None:
    ours = optuna.create_study(study_name="s", storage=MirrorStorage(open_rdb_storage(url)))
    trial = ours.ask()
    trial.suggest_float("x", 0.0, 1.0)
    trial.report(0.3, 1)
    trial.set_user_attr("k", "v")
    ours.tell(trial, 0.7)
    [stored] = optuna.load_study(study_name="s", storage=url).get_trials()
    assert stored.state == TrialState.COMPLETE and stored.value == 0.7
    assert stored.intermediate_values == {1: 0.3} and stored.user_attrs == {"k": "v"}
    assert _comparable(stored) == _comparable(ours._storage.get_all_trials(ours._study_id)[0]) \
        | {"complete": stored.datetime_complete, "start": stored.datetime_start}


def test_params_of_a_known_name_are_written_as_optuna_writes_them(url: str) -> None:
    """The first trial's params go through Optuna's ORM (their names are new to the study),
    the next ones' through study/_end.write_param: read back by Optuna, the same; a clash
    with the study's distribution and a write to a finished trial refused as Optuna does."""
    ours = optuna.create_study(study_name="s", storage=MirrorStorage(open_rdb_storage(url)))
    ours.optimize(_objective, n_trials=3)
    stored = optuna.load_study(study_name="s", storage=url).get_trials()
    mirrored = ours._storage.get_all_trials(ours._study_id)
    assert [_comparable(t) | {"complete": None} for t in stored] == \
        [_comparable(t) | {"complete": None} for t in mirrored]
    trial = ours.ask()
    with pytest.raises(ValueError, match="different distribution kind"):
        trial.suggest_categorical("x", ["a", "b"])
    ours.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        ours._storage.set_trial_param(trial._trial_id, "x", 0.5,
                                      optuna.distributions.FloatDistribution(-1.0, 1.0))
    assert optuna.load_study(study_name="s", storage=url).trials[-1].params == {}


def test_an_unfinished_trial_handed_out_is_the_callers_own(url: str) -> None:
    """optuna.Trial sets keys of the trial get_trial gives it: the mirror's stays as it was."""
    storage = MirrorStorage(open_rdb_storage(url))
    trial = optuna.create_study(study_name="s", storage=storage).ask()
    x = trial.suggest_float("x", 0.0, 1.0)
    trial.report(0.5, 1)
    trial.set_user_attr("k", "v")
    theirs = storage.get_trial(trial._trial_id)
    theirs.params["y"] = 1.0
    theirs.distributions["y"] = optuna.distributions.FloatDistribution(0.0, 2.0)
    theirs.user_attrs["k2"] = "w"
    theirs.system_attrs["s"] = 1
    theirs.intermediate_values[2] = 0.25
    again = storage.get_trial(trial._trial_id)
    assert again.params == {"x": x} and list(again.distributions) == ["x"]
    assert again.user_attrs == {"k": "v"} and again.system_attrs == {}
    assert again.intermediate_values == {1: 0.5}


def test_a_waiting_trial_is_asked_first_and_only_once(url: str) -> None:
    storage = MirrorStorage(open_rdb_storage(url), refresh_s=0.0)
    ours = optuna.create_study(study_name="s", storage=storage)
    ours.enqueue_trial({"x": 0.25})
    theirs = optuna.load_study(study_name="s", storage=url)
    theirs.enqueue_trial({"x": 0.75})
    first, second, third = ours.ask(), ours.ask(), ours.ask()
    assert first.suggest_float("x", 0.0, 1.0) == 0.25
    assert second.suggest_float("x", 0.0, 1.0) == 0.75
    assert third.number == 2
    states = [t.state for t in theirs.get_trials()]
    assert states == [TrialState.RUNNING] * 3


def test_the_history_is_the_newest_trials_and_the_best(url: str) -> None:
    plain = optuna.create_study(study_name="s", storage=url)
    for value in [0.5, -3.0, 0.1, 0.2, -2.0, 0.3, 0.4, 0.6, 0.7, 0.8]:
        plain.enqueue_trial({"x": 0.0})
        trial = plain.ask()
        trial.suggest_float("x", 0.0, 1.0)
        plain.tell(trial, value)
    running = plain.ask()  # an unfinished trial is always seen
    storage = MirrorStorage(open_rdb_storage(url), max_history=3, keep_best=2, refresh_s=0.0)
    study_id = storage.get_study_id_from_name("s")
    # Numbers 1 and 4 are the two best; 8, 9, 10 the newest (10 is RUNNING).
    assert [t.number for t in storage.get_all_trials(study_id)] == [1, 4, 8, 9, 10]
    mirrored = optuna.load_study(study_name="s", storage=storage)
    for value in [-5.0, 1.0, 1.0, 1.0, 1.0, 1.0]:
        trial = mirrored.ask()
        mirrored.tell(trial, value)
    plain.tell(running, 9.0)
    assert [t.number for t in storage.get_all_trials(study_id)] == [1, 11, 14, 15, 16]
    assert len(storage._studies[study_id].by_id) <= 3 * 5 // 4 + 2  # old trials forgotten


@pytest.mark.long
@pytest.mark.slow
def test_four_orchestrators_claim_exactly_n_trials(tmp_path: Path, shared_url: str) -> None:
    """The budget stays exact while each orchestrator's mirror lags the others'."""
    study = f"scale-{uuid.uuid4().hex[:8]}"
    hosts = [_host(tmp_path, f"host-{i}", shared_url, study, "study.n_trials=48",
                   "storage.refresh_s=0.5", "sampler=tpe", "sampler.max_history=10")
             for i in range(4)]
    for proc in hosts:
        _finish(proc, timeout=400)
    trials = _trials(shared_url, study)
    assert len(trials) == 48 and all(t["state"] == "COMPLETE" for t in trials)
    assert len({t["attrs"]["hpo.host"] for t in trials}) >= 2


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_the_budget_count_stays_exact_across_its_checkpoint(url: str) -> None:
    """Settled trials are counted once, recent ones on every claim: always the full count."""
    from datetime import datetime, timedelta

    import sqlalchemy

    from hpo_orchestrator.scheduler import Budget, count_claimed

    storage = open_rdb_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=150)
    with storage.engine.begin() as connection:  # the first 100 finished long ago, the rest now
        connection.execute(sqlalchemy.text(
            "UPDATE trials SET datetime_complete = :d WHERE number < 100"),
            {"d": datetime.now() - timedelta(hours=1)})
        connection.execute(sqlalchemy.text(
            "UPDATE trials SET datetime_complete = :d WHERE number >= 100"),
            {"d": datetime.now() + timedelta(hours=1)})
    budget = Budget(storage.engine, study._study_id, 1000, None)
    assert budget.claimed() == 150
    assert budget._upto == 100  # trial ids start at 1
    study.enqueue_trial({"x": 0.5})  # WAITING: not counted until asked
    failed = study.ask()
    storage.set_trial_user_attr(failed._trial_id, "hpo.retried", True)
    study.tell(failed, state=TrialState.FAIL)  # retried: its retry counts instead
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=80)
    with storage.engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE trials SET datetime_complete = :d"),
                           {"d": datetime.now() - timedelta(hours=1)})
    assert budget.claimed() == 230
    assert budget.claimed() == 230 and budget._upto == 231  # moved up past the recent ones
    study.enqueue_trial({"x": 0.25})
    with storage.engine.connect() as connection:
        assert budget.claimed() == count_claimed(connection, study._study_id) == 230


def test_a_trial_end_is_written_whole_or_not_at_all(url: str) -> None:
    """Everything of a trial's end is one transaction: a failure in its middle (here: the
    orchestrator's own rows, into a table that is not there) leaves the trial RUNNING with
    nothing of its end written."""
    storage = MirrorStorage(open_rdb_storage(url), refresh_s=60.0)
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    trial.report(0.5, 1)  # kept back: refresh_s has not passed
    end = TrialEnd(study._study_id, "s", {"hpo.exit_code": 0})

    storage.stage_end(trial._trial_id, replace(end, samples=[{"trial_id": trial._trial_id}]))
    with pytest.raises(sqlalchemy.exc.OperationalError, match="hpo_telemetry"):
        study.tell(trial, 0.25)
    [stored] = optuna.load_study(study_name="s", storage=url).get_trials()
    assert stored.state == TrialState.RUNNING and stored.values is None
    assert stored.user_attrs == {} and stored.intermediate_values == {}
    storage.stage_end(trial._trial_id, end)
    study.tell(trial, 0.25)
    [stored] = optuna.load_study(study_name="s", storage=url).get_trials()
    assert (stored.state, stored.value, stored.user_attrs) == (TrialState.COMPLETE, 0.25,
                                                               {"hpo.exit_code": 0})


def test_reports_reach_the_database_within_refresh_s(url: str) -> None:
    clock = _Clock()
    storage = MirrorStorage(open_rdb_storage(url), refresh_s=1.0, clock=clock)
    study = optuna.create_study(study_name="s", storage=storage,
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=0))
    trial = study.ask()
    trial.report(0.5, 1)
    assert not trial.should_prune()  # the pruner reads the report from the mirror
    plain = optuna.load_study(study_name="s", storage=url)
    assert plain.get_trials()[0].intermediate_values == {}
    clock.now += 1.0
    trial.report(0.25, 2)
    assert plain.get_trials()[0].intermediate_values == {1: 0.5, 2: 0.25}


# --- per-trial cost flat in the study's size: no statement walks the study's trials ---------


@contextmanager
def _statements(engine: Any) -> Iterator[list[tuple[str, Any]]]:
    """The statements SQLAlchemy runs on ``engine`` meanwhile, with their parameters."""
    from sqlalchemy import event

    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _walks_the_study(url: str, statements: list[tuple[str, Any]]) -> list[str]:
    """Reads of the trials table whose sqlite plan visits every trial of the study: a scan,
    a search by study_id alone, or a count."""
    import sqlite3

    walks = []
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        for statement, parameters in statements:
            if not statement.lstrip().upper().startswith("SELECT") or "trials" not in statement:
                continue
            plan = [row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {statement}",
                                                         parameters)]
            if "count(" in statement.lower() or any(
                    step.startswith("SCAN") or step.endswith("(study_id=?)") for step in plan):
                walks.append(f"{statement} -> {plan}")
    return walks


def test_ask_numbers_trials_as_optuna_does_without_counting_the_study(url: str) -> None:
    """A trial's number is the count of the study's trials before it, whoever wrote them;
    ask() gets it from the trial just before (Optuna counts them all: O(study))."""
    rdb = open_rdb_storage(url)
    ours = optuna.create_study(study_name="s", storage=MirrorStorage(rdb, refresh_s=0.0))
    theirs = optuna.load_study(study_name="s", storage=url)
    ours.ask()
    theirs.ask()
    theirs.enqueue_trial({"x": 0.5})
    with _statements(rdb.engine) as statements:
        asked = [ours.ask(), ours.ask(), ours.ask()]  # the enqueued one, then two new
    theirs.ask()
    assert [t.number for t in asked] == [2, 3, 4]
    stored = theirs.get_trials()
    assert [t.number for t in stored] == list(range(6))
    assert [t._trial_id for t in stored] == sorted(t._trial_id for t in stored)
    assert [t.state for t in stored] == [TrialState.RUNNING] * 6
    assert stored[3].datetime_start == ours._storage.get_trial(asked[1]._trial_id).datetime_start
    assert _walks_the_study(url, statements) == []


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_reaping_reads_only_the_unfinished_trials(url: str) -> None:
    """Every kind of lost trial is still found (a stale heartbeat, by the database's clock;
    one an orchestrator asked that never beat; an orphan of a dead orchestrator on this host),
    by statements that read the unfinished trials by id, never the study's finished ones. One
    no orchestrator asked (``optuna ask``: no hpo.* attr, no heartbeat) is left alone."""
    from tests.scheduler.test_reliability_storage import HOST, Run, _dead_pid

    run = Run(url, grace_s=60)
    run.study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=20)
    orphan = run.asked_by(_dead_pid())
    run.started(orphan, _dead_pid())  # one a slot took: asked ahead only, it would be requeued
    stale, never, ours, alive, outside = (run.study.ask() for _ in range(5))
    for trial in (stale, ours, alive):
        run.storage.record_heartbeat(trial._trial_id)
    for trial in (alive, never):
        run.records.write_attrs(trial._trial_id, trial.number, {"hpo.host": "elsewhere"})
    run.own = {ours._trial_id}
    with run.storage.engine.begin() as connection:
        connection.exec_driver_sql(  # both began 10 minutes ago; only `stale` beat since then
            "UPDATE trial_heartbeats SET heartbeat = datetime(CURRENT_TIMESTAMP, '-10 minutes') "
            f"WHERE trial_id = {stale._trial_id}")
        connection.exec_driver_sql(
            "UPDATE trials SET datetime_start = datetime('now', 'localtime', '-10 minutes') "
            f"WHERE trial_id IN ({stale._trial_id}, {never._trial_id}, {outside._trial_id})")
    with _statements(run.storage.engine) as statements:
        run.recovery.reap()
    states = {t.number: (t.state, t.user_attrs.get("hpo.fail_reason")) for t in run.trials()}
    assert states[orphan.number] == (TrialState.FAIL, "lost")
    for asked_ahead in (stale, never):  # found too; no slot took them: back to the queue
        assert states[asked_ahead.number] == (TrialState.WAITING, None)
    for kept in (ours, alive, outside):
        assert states[kept.number] == (TrialState.RUNNING, None)
    assert HOST != "elsewhere" and len(run.retries_of(orphan.number)) == 1
    assert statements and _walks_the_study(url, statements) == []


# Kills the orchestrator (kill -9, from inside: the moment is exact) when the transaction of
# the Nth trial's end (study/_end.finish_trial: reports, attrs, value, state, summary row) is
# about to commit: everything of that end is written, nothing committed. The trial's id goes
# to the marker file, whose presence keeps the rerun alive.
KILL_AT_END_SITECUSTOMIZE = """
import os, signal
spec = os.environ.get("HPO_TEST_KILL_AT_END")
if spec and "HPO_TRIAL_NUMBER" not in os.environ:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    marker, nth = spec.rsplit(":", 1)
    ends = []

    @event.listens_for(Engine, "before_cursor_execute")
    def _seen(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("UPDATE trials SET state=?, datetime_complete=?"):
            conn.info["ending"] = parameters[-1]

    @event.listens_for(Engine, "commit")
    def _commit(conn):
        trial_id = conn.info.pop("ending", None)
        if trial_id is not None:
            ends.append(trial_id)
            if len(ends) == int(nth) and not os.path.exists(marker):
                with open(marker, "w") as handle:
                    handle.write(str(trial_id))
                os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_trial_end_loses_no_told_trial(tmp_path: Path) -> None:
    """kill -9 while a trial's end transaction is written but not committed: that trial
    stays RUNNING with nothing of its end; every trial told before keeps its result; the
    rerun reaps the killed one at once (its orchestrator is dead), re-runs it, and leaves
    nothing RUNNING."""
    import os
    import sqlite3

    from tests.conftest import run_cli, trial_rows

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(KILL_AT_END_SITECUSTOMIZE)
    marker = tmp_path / "killed"
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "HPO_TEST_KILL_AT_END": f"{marker}:4"}
    args = ("run", "objective=custom",
            "objective.target=tests.objectives:reports10",
            "scheduler.parallel=2", "study.n_trials=8", "pruner=none",
            "storage.heartbeat_interval_s=600")  # grace of 30 min: only the dead pid tells
    killed = run_cli(tmp_path, *args, env=env)
    assert killed.code == -9, killed.stderr
    killed_id = int(marker.read_text())
    rows = {r["trial_id"]: r for r in trial_rows(tmp_path / "hpo.db")}
    told = {r["number"]: r["attrs"] for r in rows.values() if r["state"] == "COMPLETE"}
    assert len(told) == 3 and rows[killed_id]["state"] == "RUNNING"
    with sqlite3.connect(tmp_path / "hpo.db") as con:
        values = dict(con.execute("SELECT t.number, v.value FROM trials t JOIN trial_values v "
                                  "ON v.trial_id = t.trial_id").fetchall())
        summarized = {n for (n,) in con.execute("SELECT number FROM hpo_trial_summary")}
    assert set(values) == set(told) == summarized  # the killed end left no value, no summary
    assert "hpo.exit_code" not in rows[killed_id]["attrs"]
    rerun = run_cli(tmp_path, *args, env=env)
    assert rerun.code == 0, rerun.stderr
    after = {r["number"]: r for r in trial_rows(tmp_path / "hpo.db")}
    with sqlite3.connect(tmp_path / "hpo.db") as con:
        values_after = dict(con.execute("SELECT t.number, v.value FROM trials t JOIN "
                                        "trial_values v ON v.trial_id = t.trial_id").fetchall())
    for number in told:  # nothing told was lost or changed
        assert after[number]["state"] == "COMPLETE" and values_after[number] == values[number]
    assert not [r for r in after.values() if r["state"] in ("RUNNING", "WAITING")]
    lost = after[rows[killed_id]["number"]]
    assert (lost["state"], lost["attrs"]["hpo.fail_reason"]) == ("FAIL", "lost")
    assert [r["attrs"].get("hpo.retry_of") for r in after.values()].count(lost["number"]) == 1
    assert len([r for r in after.values() if r["state"] == "COMPLETE"]) == 8


def test_opening_a_database_of_the_current_schema_leaves_optunas_checks_out(url: str) -> None:
    """Our schema check at open has read the revision: Optuna's table creation (a query per
    table) and compatibility check are not run again on every start."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    optuna.create_study(study_name="s", storage=url)
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        storage = open_rdb_storage(url)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert not [s for s in seen if 'table_info("trials")' in s]
    assert optuna.load_study(study_name="s", storage=storage).trials == []


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_the_next_oom_retry_is_known_without_walking_the_study(url: str) -> None:
    """Per claim on GPU hosts: is the trial ask() takes next a retry of one that ran out of
    memory? Read from the mirror's WAITING trials, as ask() reads them."""
    from hpo_orchestrator.db import _run_io
    from tests.scheduler.test_reliability_storage import Run

    run = Run(url)
    run.study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=5)
    assert run.records.next_is_oom_retry() is False
    with run.storage.engine.begin() as connection:
        _run_io.enqueue_waiting_trial(connection, run.study._study_id, {"x": 0.5},
                                   {"hpo.retry_reason": "oom", "hpo.attempt": 2})
    run.study._storage.refresh_soon(run.study._study_id)  # as RunRecords does after enqueuing
    with _statements(run.storage.engine) as statements:
        assert run.records.next_is_oom_retry() is True
    assert _walks_the_study(url, statements) == []
    assert run.study.ask().params == {} and run.records.next_is_oom_retry() is False


def test_the_budget_counts_running_trials_from_the_mirrors_unfinished_ones(url: str) -> None:
    """At a run's end the loop polls 'is anything RUNNING anywhere?': any orchestrator's
    trial counts, WAITING and finished ones do not, nor one no orchestrator asked (``optuna
    ask``: its maker's, issue 28), and no statement walks the study."""
    from hpo_orchestrator.scheduler import Budget

    rdb = open_rdb_storage(url)
    mirror = MirrorStorage(rdb, refresh_s=0.0)
    study = optuna.create_study(study_name="s", storage=mirror)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=5)
    theirs = optuna.load_study(study_name="s", storage=url)
    running = theirs.ask()
    running.set_user_attr("hpo.host", "another")  # as another host's orchestrator asks it
    outside = theirs.ask()
    theirs.enqueue_trial({"x": 0.5})
    budget = Budget(rdb.engine, study._study_id, 10, None,
                    unfinished=lambda: mirror.unfinished_trial_ids(study._study_id))
    with _statements(rdb.engine) as statements:
        assert budget.running() == 1
    assert _walks_the_study(url, statements) == []
    theirs.tell(running, 1.0)
    assert budget.running() == 0
    theirs.tell(outside, 1.0)
