"""Schema contract: every SQL statement of the package against a database that the installed
Optuna made, on sqlite and PostgreSQL.

An Optuna upgrade that renames a column or changes how a value is stored fails the one test
named after the statement (``test_statement[sqlite-trials.BEST]``). Every module-level
``_..._SQL`` constant of the package, in whichever module it lives, must have a case here
(``test_every_statement_has_a_case``); each case runs the statement through the function that
uses it and checks what comes back against the study built below.

The study: trials #0 COMPLETE 1.0 (summarized), #1 COMPLETE 0.25 (not summarized: run by
something else), #2 PRUNED at step 1 (summarized), #3 FAIL oom, retried (summarized),
#4 RUNNING with a heartbeat, #5 WAITING (enqueued).
"""

from __future__ import annotations

import importlib
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from sqlalchemy.engine import Connection, Engine

import hpo_orchestrator
import hpo_orchestrator.db as db
from hpo_orchestrator.artifacts import _fetch
from hpo_orchestrator.db import _trial_rows, _version, connect, tables
from hpo_orchestrator.errors import ConfigError, StorageError
from hpo_orchestrator.scheduler import _budget
from hpo_orchestrator.status import _plain
from hpo_orchestrator.tally import _tally
from hpo_orchestrator.telemetry import _retention
from tests.conftest import cli_env

# Optuna warns that heartbeats are meant for Study.optimize; the RUNNING trial here records one.
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")

STUDY = "contract"
T0 = datetime(2024, 1, 1, 12, 0, 0)
CONFIG = {"study": {"n_trials": 6}, "storage": {"heartbeat_interval_s": 60}}
DEVICES = [{"index": 0, "uuid": "GPU-0"}]


@dataclass
class Built:
    backend: str
    url: str
    engine: Engine
    study_id: int
    trial_ids: dict[int, int]  # number -> trial_id


# --- building the database -----------------------------------------------------------------


@contextmanager
def _database(backend: str, tmp: Path) -> Iterator[str]:
    """A new, empty database: a sqlite file, or a PostgreSQL database of its own (dropped after)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'contract.db'}"
        return
    from tests.conftest import POSTGRES_URL, _postgres_unreachable

    reason = _postgres_unreachable()
    if reason and os.environ.get("HPO_TEST_REQUIRE_POSTGRES") == "1":
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)
    assert POSTGRES_URL
    name = f"hpo_contract_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    try:
        url = sqlalchemy.engine.make_url(POSTGRES_URL).set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _build(url: str) -> tuple[int, dict[int, int]]:
    """The study of the module doc, written through Optuna's API and our tables' writers."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = connect.open_rdb_storage(url, heartbeat_interval_s=60, grace_period_s=120)
    try:
        study = optuna.create_study(storage=storage, study_name=STUDY, direction="minimize")
        study.set_user_attr("hpo.config", CONFIG)
        study.set_user_attr("hpo.devices.h1", DEVICES)
        study.set_user_attr("not_ours", 1)
        dists = {"x": FloatDistribution(0, 1), "c": CategoricalDistribution(["a", "b"]),
                 "n": IntDistribution(1, 5)}

        def add(state: TrialState, value: float | None, steps: dict[int, float],
                attrs: dict[str, object]) -> None:
            number = len(study.trials)
            start = T0 + timedelta(seconds=20 * number)
            study.add_trial(create_trial(
                state=state, value=value, params={"x": 0.5, "c": "b", "n": 3}, distributions=dists,
                intermediate_values=steps, user_attrs=attrs))
            trial_id = study.trials[-1]._trial_id
            with storage.engine.begin() as connection:  # add_trial stamps "now": make it known
                connection.execute(sqlalchemy.text(
                    "UPDATE trials SET datetime_start = :a, datetime_complete = :b WHERE trial_id = :t"),
                    {"a": start, "b": start + timedelta(seconds=10), "t": trial_id})

        add(TrialState.COMPLETE, 1.0, {s: 1.0 / (s + 1) for s in range(5)},
            {"hpo.overhead_s": 2.0, "hpo.step_s": 0.5, "hpo.host": "h1", "hpo.gpu_index": 0,
             "hpo.worker_trial": 1})
        add(TrialState.COMPLETE, 0.25, {0: math.nan, 1: 0.5},
            {"hpo.overhead_s": 1.0, "hpo.host": "h2", "hpo.startup_s": 1.5, "hpo.gpu_verified": False,
             "hpo.worker_trial": 2,
             "hpo.opencl_platform": "PoCL"})
        add(TrialState.PRUNED, None, {0: 2.0, 1: 3.0}, {"hpo.host": "h1"})
        add(TrialState.FAIL, None, {}, {"hpo.fail_reason": "oom", "hpo.retried": True})
        running = study.ask()
        running.set_user_attr("hpo.host", "h1")
        running.set_user_attr("hpo.params_mismatch", {"lr": [0.1, 0.2]})
        running.report(0.7, 3)
        storage.record_heartbeat(running._trial_id)
        _upload_artifact(running)
        study.enqueue_trial({"x": 0.1})
        ids = {t.number: t._trial_id for t in study.get_trials(deepcopy=False)}
        tables.ensure_tables(storage.engine)
        with storage.engine.begin() as connection:
            for number, state, last_step, extra in (
                    (0, "COMPLETE", 4, {"gpu_verified": False, "opencl_platform": "PoCL",
                                        "params_mismatch": '{"lr": [0.1, 0.2]}', "fail_reason": None}),
                    (2, "PRUNED", 1, {"gpu_verified": True, "opencl_platform": None,
                                      "params_mismatch": None, "fail_reason": None}),
                    (3, "FAIL", None, {"gpu_verified": None, "opencl_platform": None,
                                       "params_mismatch": None, "fail_reason": "oom"})):
                start = (T0 + timedelta(seconds=20 * number)).timestamp()
                tables.insert_summary(connection, {
                    "trial_id": ids[number], "study_id": study._study_id, "number": number,
                    "state": state, "host": "h1", "gpu_index": 0, "start_s": start,
                    "end_s": start + 10, "startup_s": 1.0, "first_decision_s": 3.0,
                    "last_step": last_step, "gpu_util_mean": 80.0, "gpu_util_compute_mean": 90.0,
                    "gpu_energy_j": 500.0, **extra})
            tables.insert_samples(connection, [
                {"trial_id": ids[0], "ts": T0 + timedelta(seconds=1), "gpu_index": 0, "sm_util": 50.0,
                 "cpu_util": 100.0, "phase": "train"},
                {"trial_id": ids[0], "ts": T0 + timedelta(seconds=2), "gpu_index": 0, "sm_util": 70.0,
                 "cpu_util": 90.0, "phase": "train"},
                {"trial_id": ids[4], "ts": T0 + timedelta(seconds=90), "gpu_index": None, "sm_util": None,
                 "cpu_util": 40.0, "phase": None}])
        return study._study_id, ids
    finally:
        storage.engine.dispose()


ARTIFACT_STORE = "/shared/artifacts"


def _upload_artifact(trial: optuna.Trial) -> None:
    """The running trial keeps a file as Optuna's own upload_artifact records it, and
    hpo.artifacts names the store, as the orchestrator does."""
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "model.txt").write_text("weights")
        artifact_id = upload_artifact(artifact_store=FileSystemArtifactStore(folder),
                                      file_path=str(Path(folder) / "model.txt"),
                                      study_or_trial=trial)
    trial.set_user_attr("hpo.artifacts", [
        {"artifact_id": artifact_id, "filename": "model.txt", "store": ARTIFACT_STORE}])


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    with _database(request.param, tmp_path_factory.mktemp("contract")) as url:
        study_id, ids = _build(url)
        engine = connect.create_engine(url, read_only=False)  # some cases write (rolled back)
        try:
            yield Built(request.param, url, engine, study_id, ids)
        finally:
            engine.dispose()


# --- one case per statement ----------------------------------------------------------------

Case = Callable[[Built, Connection], None]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(function: Case) -> Case:
        CASES[name] = function
        return function
    return register


def _only(backend: str, built: Built) -> None:
    if built.backend != backend:
        pytest.skip(f"{backend} only")


@case("connect.SQLITE_TABLES")
def _(built: Built, connection: Connection) -> None:
    _only("sqlite", built)
    connect.create_engine(built.url).dispose()  # an Optuna file passes
    foreign = Path(sqlalchemy.engine.make_url(built.url).database or "").with_name("foreign.db")
    with sqlite3.connect(foreign) as other:
        other.execute("CREATE TABLE t (x)")
    with pytest.raises(StorageError, match="not an Optuna one"):
        connect.create_engine(f"sqlite:///{foreign}")


@case("connect.ADVISORY_LOCK")
@case("connect.ADVISORY_UNLOCK")
def _(built: Built, connection: Connection) -> None:
    _only("postgresql", built)
    held = ("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = :ns "
            "AND objid = 0 AND granted AND database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())")
    with connect.setup_lock(built.url):
        assert connection.execute(sqlalchemy.text(held), {"ns": connect.ADVISORY_NAMESPACE}).scalar() == 1
    assert connection.execute(sqlalchemy.text(held), {"ns": connect.ADVISORY_NAMESPACE}).scalar() == 0


@case("version.REVISION")
@case("version.VERSION_INFO")
def _(built: Built, connection: Connection) -> None:
    assert _version.schema_of(connection) == (db.SCHEMA_REVISION, 12, optuna.__version__)


@case("study.STUDIES")
def _(built: Built, connection: Connection) -> None:
    assert db.list_studies(connection) == [STUDY]


@case("study.STUDY_ID")
def _(built: Built, connection: Connection) -> None:
    assert db.study_id_of(connection, STUDY) == (built.study_id, STUDY)
    assert db.study_id_of(connection, None) == (built.study_id, STUDY)
    with pytest.raises(ConfigError, match="no study named 'nope'"):
        db.study_id_of(connection, "nope")


@case("study.STUDY_ATTRS")
def _(built: Built, connection: Connection) -> None:
    assert db.study_attrs(connection, built.study_id) == {"hpo.config": CONFIG, "hpo.devices.h1": DEVICES}
    assert db.study_config(connection, built.study_id) == CONFIG


@case("space.NAMES")
def _(built: Built, connection: Connection) -> None:
    """Each name the study's trials always suggested one way, with that distribution."""
    from hpo_orchestrator.study import read_study_space

    assert read_study_space(connection, built.study_id) == {
        "x": FloatDistribution(0, 1), "c": CategoricalDistribution(["a", "b"]),
        "n": IntDistribution(1, 5)}
    assert read_study_space(connection, built.study_id + 1000) == {}


@case("study.NOW")
@case("trial_rows.HEARTBEAT")
def _(built: Built, connection: Connection) -> None:
    beat = db.heartbeat_of(connection, built.trial_ids[4])
    now = db.database_now(connection)
    assert beat is not None and now is not None
    assert 0 <= (now - beat).total_seconds() < 600  # one clock: the database's
    assert db.heartbeat_of(connection, built.trial_ids[0]) is None


@case("trial_rows.SUMMARY_ROWS")
def _(built: Built, connection: Connection) -> None:
    rows = sorted(db.summary_rows(connection, built.study_id))
    assert [(r.number, r.state, r.last_step) for r in rows] == [(0, "COMPLETE", 4), (2, "PRUNED", 1),
                                                                 (3, "FAIL", None)]
    assert rows[0].end_s - rows[0].start_s == pytest.approx(10.0)
    first = rows[0]
    assert (first.host, first.gpu_index, first.gpu_util_mean, first.gpu_energy_j) == ("h1", 0, 80.0, 500.0)


@case("trial_rows.UNCOVERED")
def _(built: Built, connection: Connection) -> None:
    every = db.uncovered_trials(connection, built.study_id, has_summary=False)
    assert [u.row.number for u in sorted(every, key=lambda u: u.row.number)] == [0, 1, 2, 3, 4, 5]
    by_number = {u.row.number: u for u in every}
    assert [by_number[n].row.state for n in range(6)] == ["COMPLETE", "COMPLETE", "PRUNED", "FAIL",
                                                          "RUNNING", "WAITING"]
    assert by_number[0].row.last_step == 4 and by_number[5].row.last_step is None
    one = by_number[1].row
    assert one.start_s is not None and one.end_s is not None
    assert one.end_s - one.start_s == pytest.approx(10.0)
    assert by_number[4].row.end_s is None and by_number[4].trial_id == built.trial_ids[4]


@case("trial_rows.NOT_SUMMARIZED")
def _(built: Built, connection: Connection) -> None:
    rest = db.uncovered_trials(connection, built.study_id, has_summary=True)
    assert sorted(u.row.number for u in rest) == [1, 4, 5]


@case("trial_rows.ATTRS_BY_ID")
def _(built: Built, connection: Connection) -> None:
    by_number = {u.row.number: u for u in db.uncovered_trials(connection, built.study_id, True)}
    one = by_number[1]
    assert (one.row.host, one.row.startup_s) == ("h2", 1.5)
    assert one.attrs["hpo.gpu_verified"] is False and one.attrs["hpo.opencl_platform"] == "PoCL"
    assert "hpo.overhead_s" not in one.attrs  # only the keys status reads
    assert by_number[4].attrs == {"hpo.host": "h1", "hpo.params_mismatch": {"lr": [0.1, 0.2]}}


@case("trial_rows.ATTRS")
def _(built: Built, connection: Connection) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_trial_rows, "_ATTRS_BY_ID_UP_TO", 0)  # the whole-study branch (> 500 trials)
        by_number = {u.row.number: u for u in db.uncovered_trials(connection, built.study_id, True)}
    assert by_number[1].row.host == "h2" and by_number[4].row.host == "h1"
    assert by_number[5].attrs == {}


@case("trial_rows.STATE_COUNTS")
def _(built: Built, connection: Connection) -> None:
    assert db.state_counts(connection, built.study_id) == {
        "COMPLETE": 2, "PRUNED": 1, "FAIL": 1, "RUNNING": 1, "WAITING": 1}


@case("trial_rows.PRUNE_STEPS")
def _(built: Built, connection: Connection) -> None:
    assert db.summary_prune_steps(connection, built.study_id) == {1: 1}


@case("trial_rows.MAX_COMPLETE_STEP")
def _(built: Built, connection: Connection) -> None:
    assert db.summary_max_complete_step(connection, built.study_id) == 4


@case("trial_rows.FLAGS")
def _(built: Built, connection: Connection) -> None:
    assert sorted(db.summary_flags(connection, built.study_id)) == [
        (0, False, "PoCL", {"lr": [0.1, 0.2]}, None), (3, None, None, None, "oom")]


@case("trial_rows.BEST")
@case("trial_rows.PARAMS")
def _(built: Built, connection: Connection) -> None:
    params = {"x": 0.5, "c": "b", "n": 3}
    assert db.best_trial(connection, built.study_id, "minimize") == {"number": 1, "value": 0.25,
                                                                       "params": params}
    best = db.best_trial(connection, built.study_id, "maximize")
    assert best is not None and best["number"] == 0 and isinstance(best["params"]["n"], int)


@case("best.DIRECTIONS")
@case("best.COMPLETE_VALUES")
@case("best.PARAMS")
def _(built: Built, connection: Connection) -> None:
    assert db.study_directions(connection, built.study_id) == ["minimize"]
    directions, front = db.best_trials(connection, built.study_id)
    assert (directions, [(t.number, t.values) for t in front]) == (["minimize"], [(1, (0.25,))])
    assert front[0].trial_id == built.trial_ids[1]
    params = db.trial_params(connection, built.trial_ids[1])
    assert params == {"x": 0.5, "c": "b", "n": 3} and list(params) == ["x", "c", "n"]
    assert isinstance(params["n"], int)


@case("best.SPACE")
def _(built: Built, connection: Connection) -> None:
    space = {name: optuna.distributions.json_to_distribution(text)
             for name, text in db.study_space(connection, built.study_id).items()}
    assert space == {"c": CategoricalDistribution(["a", "b"]), "n": IntDistribution(1, 5),
                     "x": FloatDistribution(0, 1)}
    assert db.study_space(connection, built.study_id + 1000) == {}


@case("trial_rows.VALUES")
def _(built: Built, connection: Connection) -> None:
    assert db.trial_values(connection, built.study_id) == {0: 1.0, 1: 0.25}


@case("curves.TRIALS")
def _(built: Built, connection: Connection) -> None:
    trials = db.trials_with_values(connection, built.study_id)
    assert [(t.number, t.state, t.value) for t in trials] == [
        (0, "COMPLETE", 1.0), (1, "COMPLETE", 0.25), (2, "PRUNED", None), (3, "FAIL", None),
        (4, "RUNNING", None), (5, "WAITING", None)]
    assert [t.trial_id for t in trials] == [built.trial_ids[n] for n in range(6)]


@case("curves.INTERMEDIATE")
def _(built: Built, connection: Connection) -> None:
    steps = db.intermediate_values(connection, built.study_id)
    ids = built.trial_ids
    assert steps[ids[0]] == [(s, 1.0 / (s + 1)) for s in range(5)]
    assert steps[ids[1]][0][0] == 0 and math.isnan(steps[ids[1]][0][1]) and steps[ids[1]][1] == (1, 0.5)
    assert steps[ids[2]] == [(0, 2.0), (1, 3.0)] and steps[ids[4]] == [(3, 0.7)]
    assert ids[3] not in steps


@case("curves.TIMINGS")
def _(built: Built, connection: Connection) -> None:
    assert db.step_timings(connection, built.study_id) == {built.trial_ids[0]: (2.0, 0.5)}


@case("curves.WORKER_FIRSTS")
def _(built: Built, connection: Connection) -> None:
    """A worker's first trial (hpo.worker_trial 1), not its second; from number ``first`` on."""
    assert db.worker_firsts(connection, built.study_id) == {built.trial_ids[0]}
    assert db.worker_firsts(connection, built.study_id, 1) == set()
    assert db.worker_firsts(connection, built.study_id + 1000) == set()


@case("curves.LAST_NUMBER")
def _(built: Built, connection: Connection) -> None:
    """The newest N trials' reads start at the right number, and every reader honours it."""
    assert db.first_of_last(connection, built.study_id, None) == 0
    assert db.first_of_last(connection, built.study_id, 2) == 4
    assert db.first_of_last(connection, built.study_id, 99) == 0
    assert db.first_of_last(connection, built.study_id + 1000, 2) == 0  # no trials
    ids = built.trial_ids
    assert [t.number for t in db.trials_with_values(connection, built.study_id, 2)] == [2, 3, 4, 5]
    assert sorted(db.intermediate_values(connection, built.study_id, 2)) == sorted([ids[2], ids[4]])
    assert db.step_timings(connection, built.study_id, 1) == {}
    assert db.trial_values(connection, built.study_id, 1) == {1: 0.25}
    assert sorted(r.number for r in db.trial_rows(connection, built.study_id, 2)) == [2, 3, 4, 5]
    assert [s.trial_id for s in db.telemetry_samples(connection, built.study_id, 1)] == [ids[4]]


@case("telemetry.HAS_TRIAL")
def _(built: Built, connection: Connection) -> None:
    assert db.has_trial(connection, built.study_id, 0) and not db.has_trial(connection, built.study_id, 99)


@case("telemetry.EXPORT")
def _(built: Built, connection: Connection) -> None:
    rows = db.telemetry_rows(connection, built.study_id, None)
    assert [r[0] for r in rows] == [0, 0, 4]
    columns = dict(zip(["trial_number", *db.TELEMETRY_COLUMNS], rows[0], strict=True))
    assert (columns["trial_id"], columns["sm_util"], columns["phase"]) == (built.trial_ids[0], 50.0, "train")
    # the readers' column list (no SQLAlchemy) is the table's, in its order
    assert db.TELEMETRY_COLUMNS == tuple(c.name for c in tables.telemetry_table.columns if c.name != "id")


@case("telemetry.ONE_TRIAL")
def _(built: Built, connection: Connection) -> None:
    assert [r[0] for r in db.telemetry_rows(connection, built.study_id, 4)] == [4]


@case("telemetry.SAMPLES")
@case("telemetry.HOST")
def _(built: Built, connection: Connection) -> None:
    samples = db.telemetry_samples(connection, built.study_id)
    assert [(s.ts, s.trial_id, s.gpu_index, s.sm_util, s.cpu_util, s.host) for s in samples] == [
        (T0 + timedelta(seconds=1), built.trial_ids[0], 0, 50.0, 100.0, "h1"),
        (T0 + timedelta(seconds=2), built.trial_ids[0], 0, 70.0, 90.0, "h1"),
        (T0 + timedelta(seconds=90), built.trial_ids[4], None, None, 40.0, None)]


@case("retention.CANDIDATES")
def _(built: Built, connection: Connection) -> None:
    ended = _retention.retention_candidates(connection, built.study_id, "h1", 0.0, 4e9, 10)
    assert [trial for trial, _ in ended] == [built.trial_ids[n] for n in (0, 2, 3)]
    assert _retention.retention_candidates(connection, built.study_id, "h1", ended[0][1], 4e9, 1) \
        == [ended[1]]


@case("retention.COUNTS")
@case("retention.ROWS")
@case("retention.DELETE")
def _(built: Built, connection: Connection) -> None:
    """Trial #0's two samples become one: means of utilization, its first time (the case's
    connection is never committed, so the other cases still see both)."""
    assert not _retention.downsample_trial(connection, built.trial_ids[0], max_rows=2)
    assert _retention.downsample_trial(connection, built.trial_ids[0], max_rows=1)
    rows = db.telemetry_rows(connection, built.study_id, 0)
    columns = [dict(zip(["trial_number", *db.TELEMETRY_COLUMNS], r, strict=True)) for r in rows]
    assert [(db.to_datetime(c["ts"]), c["sm_util"], c["cpu_util"], c["phase"]) for c in columns] == [
        (T0 + timedelta(seconds=1), 60.0, 95.0, "train")]


@case("budget.CLAIMED")
def _(built: Built, connection: Connection) -> None:
    assert _budget.count_claimed(connection, built.study_id) == 4  # not WAITING, not the retried FAIL


@case("budget.CLAIMED_UPTO")
def _(built: Built, connection: Connection) -> None:
    assert _budget.count_claimed_upto(connection, built.study_id, built.trial_ids[3]) == 3


@case("budget.ROWS_AFTER")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    assert _budget.claimed_rows_after(connection, built.study_id, ids[2]) == [
        (ids[3], "FAIL", T0 + timedelta(seconds=70), True), (ids[4], "RUNNING", None, False),
        (ids[5], "WAITING", None, False)]


@case("budget.UNSETTLED")
@case("budget.MAX_ID")
def _(built: Built, connection: Connection) -> None:
    later = T0 + timedelta(hours=1)
    assert _budget.settled_upto(connection, built.study_id, later) == built.trial_ids[3]  # #4 RUNNING
    assert _budget.settled_upto(connection, built.study_id, T0 + timedelta(seconds=35)) == built.trial_ids[1]
    assert _budget.settled_upto(connection, built.study_id + 999, later) == -1  # no trial at all


@case("mirror.TRIALS")
@case("mirror.PARAMS")
@case("mirror.VALUES")
@case("mirror.STEPS")
@case("mirror.USER_ATTRS")
@case("mirror.SYSTEM_ATTRS")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.study._mirror import read_trials

    ids = built.trial_ids
    storage = optuna.storages.RDBStorage(built.url)
    try:
        expected = {t.number: t for t in storage.get_all_trials(built.study_id)}
    finally:
        storage.engine.dispose()
    read = read_trials(connection, built.study_id, after=ids[3], ids={ids[1]})
    assert [t.number for t in read] == [1, 4, 5]
    for trial in read:
        want = expected[trial.number]
        assert (trial.state, trial.values, trial.params, trial.distributions, trial.user_attrs,
                trial.system_attrs, trial.datetime_start, trial.datetime_complete) == (
            want.state, want.values, want.params, want.distributions, want.user_attrs,
            want.system_attrs, want.datetime_start, want.datetime_complete)
        assert repr(trial.intermediate_values) == repr(want.intermediate_values)  # NaN too


@case("mirror.RECENT_IDS")
@case("mirror.BEST_IDS")
@case("mirror.UNFINISHED_BEFORE")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.study import _mirror

    ids = built.trial_ids
    assert _mirror.recent_trial_ids(connection, built.study_id, 2) == [ids[5], ids[4]]
    assert _mirror.best_trial_ids(connection, built.study_id, 1, maximize=False) == [ids[1]]
    assert _mirror.best_trial_ids(connection, built.study_id, 5, maximize=True) == [ids[0], ids[1]]
    assert _mirror.unfinished_trial_ids_before(connection, built.study_id, ids[5]) == [ids[4]]


@case("budget.RUNNING")
def _(built: Built, connection: Connection) -> None:
    assert _budget.count_running(connection, built.study_id) == 1


@case("budget.LOCK")
def _(built: Built, connection: Connection) -> None:
    _only("postgresql", built)
    held = ("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = :ns "
            "AND objid = :s AND granted AND pid = pg_backend_pid()")
    params = {"ns": connect.ADVISORY_NAMESPACE, "s": built.study_id}
    with connection.begin():
        _budget.lock_study_budget(connection, built.study_id)
        assert connection.execute(sqlalchemy.text(held), params).scalar() == 1
    assert connection.execute(sqlalchemy.text(held), params).scalar() == 0  # released with the transaction


@case("run_io.TRIAL_STATE")
@case("run_io.HOLD_RUNNING")
@case("run_io.SET_START")
@case("run_io.DELETE_ATTRS")
@case("run_io.INSERT_ATTR")
def _(built: Built, connection: Connection) -> None:
    """Rewrites the RUNNING trial's own values (the study stays as built); a finished trial refuses."""
    from hpo_orchestrator.db import _run_io

    running = built.trial_ids[4]
    start = connection.execute(sqlalchemy.text(
        "SELECT datetime_start FROM trials WHERE trial_id = :t"), {"t": running}).scalar()
    with built.engine.begin() as writer:
        _run_io.write_trial_attrs(writer, running, 4, {"hpo.host": "h1"}, started=db.to_datetime(start))
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError, match="trial 3 is"):
            _run_io.write_trial_attrs(writer, built.trial_ids[3], 3, {"hpo.host": "h1"})
    with built.engine.connect() as reader:
        assert reader.execute(sqlalchemy.text(
            "SELECT value_json FROM trial_user_attributes WHERE trial_id = :t AND key = 'hpo.host'"),
            {"t": running}).scalar() == '"h1"'


@case("run_io.OWNED")
def _(built: Built, connection: Connection) -> None:
    """A trial's start is written only while its orchestrator (host and pid) still holds it:
    another run that asked it again after it was requeued holds it now."""
    from hpo_orchestrator.db import _run_io

    running = built.trial_ids[4]
    with connection.begin() as transaction:
        _run_io.write_trial_attrs(connection, running, 4, {"hpo.host": "h1", "hpo.orchestrator_pid": 7})
        _run_io.write_trial_attrs(connection, running, 4, {"hpo.slot": 0}, owner=("h1", 7))
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError, match="another run"):
            _run_io.write_trial_attrs(connection, running, 4, {"hpo.slot": 1}, owner=("h1", 8))
        transaction.rollback()


@case("run_io.REQUEUE")
@case("run_io.FORGET_BEAT")
@case("run_io.FORGET_OWNER")
def _(built: Built, connection: Connection) -> None:
    """An asked-ahead trial back to WAITING: no start, no heartbeat, no owner; the next ask
    sees it as Optuna's enqueued trials; a finished trial is left as it is."""
    from hpo_orchestrator.db import _run_io

    running = built.trial_ids[4]
    with connection.begin() as transaction:
        _run_io.write_trial_attrs(connection, running, 4, {"hpo.host": "h1", "hpo.orchestrator_pid": 7})
        assert _run_io.requeue_unstarted_trial(connection, running)
        state, start = connection.execute(sqlalchemy.text(
            "SELECT state, datetime_start FROM trials WHERE trial_id = :t"), {"t": running}).one()
        assert (db.state_name(state), start) == ("WAITING", None)
        assert db.heartbeat_of(connection, running) is None
        keys = {k for (k,) in connection.execute(sqlalchemy.text(
            "SELECT key FROM trial_user_attributes WHERE trial_id = :t"), {"t": running})}
        assert not {"hpo.host", "hpo.orchestrator_pid"} & keys
        assert not _run_io.requeue_unstarted_trial(connection, built.trial_ids[3])  # FAIL
        transaction.rollback()


@case("run_io.ATTEMPT")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.db import _run_io

    assert _run_io.attempt_of(connection, built.trial_ids[0]) == 1  # no hpo.attempt: not a retry


@case("run_io.RUNNING_AMONG")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.db import _run_io

    found = _run_io.running_among(connection, list(built.trial_ids.values()))  # only #4 RUNNING
    assert [(t.trial_id, t.host, t.pid, t.orchestrator_pid) for t in found] == \
        [(built.trial_ids[4], "h1", None, None)]
    [running] = found
    assert running.started is not None and running.heartbeat is not None and running.now is not None
    assert timedelta(0) <= running.now - running.heartbeat < timedelta(minutes=10)  # one clock
    assert _run_io.running_among(connection, [built.trial_ids[0], built.trial_ids[5]]) == []
    assert _run_io.running_among(connection, []) == []


@case("run_io.NO_LONGER_RUNNING")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.db import _run_io

    ids = [built.trial_ids[0], built.trial_ids[3], built.trial_ids[4]]
    assert _run_io.no_longer_running(connection, ids) == {built.trial_ids[0], built.trial_ids[3]}
    assert _run_io.no_longer_running(connection, []) == set()


@case("run_io.FAIL_RUNNING")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.db import _run_io

    with connection.begin() as transaction:
        assert _run_io.fail_running_trial(connection, built.trial_ids[4]) is True
        assert _run_io.fail_running_trial(connection, built.trial_ids[4]) is False  # finished now
        assert _run_io.fail_running_trial(connection, built.trial_ids[3]) is False
        row = connection.execute(sqlalchemy.text(
            "SELECT state, datetime_complete FROM trials WHERE trial_id = :t"),
            {"t": built.trial_ids[4]}).one()
        assert db.state_name(row[0]) == "FAIL" and row[1] is not None
        transaction.rollback()


@case("run_io.LOCK_STUDY_ROW")
@case("run_io.INSERT_WAITING")
@case("run_io.PAST_TRIALS")
@case("run_io.SET_NUMBER")
@case("run_io.INSERT_SYSTEM_ATTR")
def _(built: Built, connection: Connection) -> None:
    """A WAITING trial written as Optuna's enqueue_trial wrote #5 (rolled back; the ask that
    takes it is tested in tests/scheduler/test_reliability_storage.py)."""
    from hpo_orchestrator.db import _run_io

    columns = "SELECT number, state, datetime_start, datetime_complete FROM trials WHERE trial_id = :t"
    system = "SELECT key, value_json FROM trial_system_attributes WHERE trial_id = :t"
    with connection.begin() as transaction:
        trial_id = _run_io.enqueue_waiting_trial(connection, built.study_id, {"x": 0.1},
                                              {"hpo.retry_of": 3, "hpo.attempt": 2})
        ours = connection.execute(sqlalchemy.text(columns), {"t": trial_id}).one()
        optunas = connection.execute(sqlalchemy.text(columns), {"t": built.trial_ids[5]}).one()
        assert ours[0] == 6 and db.state_name(ours[1]) == db.state_name(optunas[1]) == "WAITING"
        assert (ours[2], ours[3]) == (optunas[2], optunas[3]) == (None, None)
        assert connection.execute(sqlalchemy.text(system), {"t": trial_id}).all() == \
            connection.execute(sqlalchemy.text(system), {"t": built.trial_ids[5]}).all()
        attrs = dict(connection.execute(sqlalchemy.text(
            "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = :t"), {"t": trial_id}).all())
        assert attrs == {"hpo.retry_of": "3", "hpo.attempt": "2"}
        transaction.rollback()


@case("run_io.INSERT_RUNNING")
@case("run_io.PREVIOUS_NUMBER")
def _(built: Built, connection: Connection) -> None:
    """A trial written as Optuna's ask() writes one, numbered without counting the study;
    a trial before it without a number (never left by Optuna) falls back to the count."""
    from hpo_orchestrator.db import _run_io

    columns = "SELECT number, state, datetime_start, datetime_complete FROM trials WHERE trial_id = :t"
    started = datetime(2024, 1, 2, 3, 4, 5)  # no microseconds: stored as Optuna stores them
    with connection.begin() as transaction:
        trial_id, number = _run_io.create_running_trial(connection, built.study_id, started)
        ours = connection.execute(sqlalchemy.text(columns), {"t": trial_id}).one()
        optunas = connection.execute(sqlalchemy.text(columns), {"t": built.trial_ids[4]}).one()
        assert number == ours[0] == 6 and db.state_name(ours[1]) == db.state_name(optunas[1]) == "RUNNING"
        assert db.to_datetime(ours[2]) == started and ours[3] is None
        if built.backend == "sqlite":  # text: the same format as Optuna's, microseconds included
            assert len(str(ours[2])) == len(str(optunas[2]))
        connection.execute(sqlalchemy.text("UPDATE trials SET number = NULL WHERE trial_id = :t"),
                           {"t": trial_id})
        assert _run_io.create_running_trial(connection, built.study_id, started)[1] == 7
        transaction.rollback()


@case("run_io.FIRST_HEARTBEAT")
def _(built: Built, connection: Connection) -> None:
    """A new trial's user attrs and first heartbeat, written with its row: the heartbeat as
    Optuna's record_heartbeat stamps #4's (the database's clock), read back by reaping."""
    from hpo_orchestrator.db import _run_io

    beats = "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"
    with connection.begin() as transaction:
        trial_id, _number = _run_io.create_running_trial(connection, built.study_id, datetime.now())
        _run_io.start_running_trial(connection, trial_id, {"hpo.host": "h2", "hpo.orchestrator_pid": 7})
        ours = connection.execute(sqlalchemy.text(beats), {"t": trial_id}).scalar()
        optunas = connection.execute(sqlalchemy.text(beats), {"t": built.trial_ids[4]}).scalar()
        if built.backend == "sqlite":  # text: as SQLAlchemy writes a datetime (datetime_start),
            # to the millisecond where Optuna's has whole seconds; both read back as datetimes
            assert len(str(ours)) == len("2024-01-01 12:00:00.000000")
            assert db.to_datetime(ours) is not None and db.to_datetime(optunas) is not None
        (row,) = _run_io.running_among(connection, [trial_id])
        assert (row.host, row.orchestrator_pid, row.pid) == ("h2", 7, None)
        assert row.heartbeat is not None and row.now is not None
        assert timedelta(0) <= row.now - row.heartbeat < timedelta(minutes=10)  # one clock
        transaction.rollback()


@case("run_io.HEARTBEAT")
@case("run_io.NEW_HEARTBEAT")
@case("run_io.LOCK_HEARTBEAT")
def _(built: Built, connection: Connection) -> None:
    """A heartbeat stamped by the database's clock as it is written: a new row, then an
    update of it; reaping reads it back as fresh."""
    from hpo_orchestrator.db import _run_io

    beats = "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"
    with connection.begin() as transaction:
        trial_id, _number = _run_io.create_running_trial(connection, built.study_id, datetime.now())
        _run_io.record_heartbeat(connection, trial_id)  # no row yet: inserted
        first = connection.execute(sqlalchemy.text(beats), {"t": trial_id}).scalar()
        _run_io.record_heartbeat(connection, trial_id)  # updated
        count = connection.execute(sqlalchemy.text(
            "SELECT COUNT(*) FROM trial_heartbeats WHERE trial_id = :t"), {"t": trial_id}).scalar()
        (row,) = _run_io.running_among(connection, [trial_id])
        assert first is not None and count == 1
        assert row.heartbeat is not None and row.now is not None
        # one clock (PostgreSQL's now is this transaction's start: the stamp is later)
        assert abs(row.now - row.heartbeat) < timedelta(minutes=10)
        assert db.to_datetime(first) <= row.heartbeat
        transaction.rollback()


@case("run_io.STARTED_AT")
@case("run_io.ATTRS_OF")
def _(built: Built, connection: Connection) -> None:
    """An ask's retry finds the trial its earlier try committed (the same start, to the
    microsecond as written, and the same attrs) and takes it; one of another orchestrator
    started at that instant, or one the caller holds, is not taken: a new trial is made."""
    from hpo_orchestrator.db import _run_io

    started = datetime(2024, 1, 2, 3, 4, 5, 123456)
    mine, other = {"hpo.host": "h2", "hpo.orchestrator_pid": 7}, {"hpo.host": "h3", "hpo.orchestrator_pid": 7}
    with connection.begin() as transaction:
        first = _run_io.ask_running_trial(connection, built.study_id, started, other)
        earlier = _run_io.ask_running_trial(connection, built.study_id, started, mine)
        assert _run_io.ask_running_trial(connection, built.study_id, started, mine, known=set()) == earlier
        again = _run_io.ask_running_trial(connection, built.study_id, started, mine, known={earlier[0]})
        assert len({first, earlier, again}) == 3 and again[1] == earlier[1] + 1
        transaction.rollback()


@case("run_io.MAX_COMPLETED_STEP")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.db import _run_io

    assert _run_io.max_completed_step(connection, built.study_id) == 4  # #0 reported steps 0-4


@case("detail.TRIAL")
@case("detail.TRIAL_VALUE")
@case("detail.TRIAL_ATTRS")
def _(built: Built, connection: Connection) -> None:
    one = db.trial_detail(connection, built.study_id, 1)
    assert one is not None
    assert (one["state"], one["value"], one["params"]) == ("COMPLETE", 0.25, {"x": 0.5, "c": "b", "n": 3})
    assert one["attrs"]["hpo.host"] == "h2" and one["end"] - one["start"] == timedelta(seconds=10)
    assert db.trial_detail(connection, built.study_id, 2)["value"] is None  # type: ignore[index]
    assert db.trial_detail(connection, built.study_id, 99) is None


@case("detail.FAIL_ERRORS")
def _(built: Built, connection: Connection) -> None:
    # every FAIL trial, retried ones too (#3 ran out of memory and ran again)
    assert db.fail_errors(connection, built.study_id) == {
        3: {"hpo.fail_reason": "oom", "hpo.retried": True}}


@case("detail.LATEST_STUDY")
def _(built: Built, connection: Connection) -> None:
    assert db.latest_study(connection) == STUDY


@case("design.USER_QUERIES")
def _(built: Built, connection: Connection) -> None:
    """The queries docs/DESIGN.md §2.6 promises users on the sqlite file."""
    _only("sqlite", built)
    path = sqlalchemy.engine.make_url(built.url).database
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as plain:
        counts = dict(plain.execute(
            "SELECT state, COUNT(*) FROM trials WHERE study_id = (SELECT study_id FROM studies "
            "WHERE study_name = ?) GROUP BY state", (STUDY,)).fetchall())
        durations = {state: (avg, n) for state, avg, n in plain.execute(
            "SELECT state, AVG((julianday(datetime_complete) - julianday(datetime_start)) * 86400) "
            "AS avg_s, COUNT(*) FROM trials WHERE study_id = (SELECT study_id FROM studies "
            "WHERE study_name = ?) AND datetime_complete IS NOT NULL GROUP BY state", (STUDY,))}
    assert counts == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 1, "RUNNING": 1, "WAITING": 1}
    assert durations["COMPLETE"][0] == pytest.approx(10.0, abs=0.01) and durations["COMPLETE"][1] == 2


@case("fetch.ARTIFACT_META")
@case("fetch.ARTIFACT_STORES")
def _(built: Built, connection: Connection) -> None:
    found = _fetch.trial_artifacts(connection, built.study_id)
    assert [(a.number, a.filename, a.mimetype, a.encoding, a.store) for a in found] == [
        (4, "model.txt", "text/plain", None, ARTIFACT_STORE)]
    assert _fetch.trial_artifacts(connection, built.study_id, {0, 2}) == []


@case("tally.TALLY")
@case("tally.TALLY_LOCK")
@case("tally.TALLY_UPDATE")
@case("tally.TALLY_INSERT")
def _(built: Built, connection: Connection) -> None:
    with connection.begin() as transaction:
        assert _tally.read_tally(connection, built.study_id) is None
        _tally.write_tally(connection, built.study_id, 1, "{}")
        _tally.write_tally(connection, built.study_id, 2, '{"a": 1}')  # the second one updates
        assert _tally.read_tally(connection, built.study_id, for_update=True) == (2, '{"a": 1}')
        transaction.rollback()


@case("tally.SINCE_TRIALS")
@case("tally.SINCE_SUMMARY")
@case("tally.SINCE_ATTRS")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    since = _tally.trials_since(connection, built.study_id, ids[1], [ids[1]])
    assert [(t.row.number, t.row.state, t.summarized) for t in since] == [
        (1, "COMPLETE", False), (2, "PRUNED", True), (3, "FAIL", True), (4, "RUNNING", False),
        (5, "WAITING", False)]
    one, two, three, four = since[:4]
    assert (one.trial_id, one.value, one.row.host, one.row.startup_s) == (ids[1], 0.25, "h2", 1.5)
    assert one.flags == (1, False, "PoCL", None, None) and one.row.last_step == 1
    assert one.row.end_s is not None and one.row.start_s is not None
    assert one.row.end_s - one.row.start_s == pytest.approx(10.0)
    assert (two.row.last_step, two.value, two.flags.gpu_verified) == (1, None, True)
    assert three.flags.fail_reason == "oom" and three.attrs == {}
    assert four.attrs == {"hpo.host": "h1", "hpo.params_mismatch": {"lr": [0.1, 0.2]}}
    assert four.flags.params_mismatch == {"lr": [0.1, 0.2]} and four.row.end_s is None
    assert _tally.trials_since(connection, built.study_id, ids[5], []) == []


@case("plain.HPO_ATTR")
def _(built: Built, connection: Connection) -> None:
    """A database with our attrs is no plain one; without them (rolled back) and without the
    summary table it is."""
    with connection.begin() as transaction:
        assert db.fetch_one(connection, _plain._HPO_ATTR_SQL) is not None
        assert not _plain.is_plain(connection)
        connection.execute(sqlalchemy.text("DELETE FROM trial_user_attributes WHERE key LIKE 'hpo.%'"))
        connection.execute(sqlalchemy.text("DROP TABLE hpo_trial_summary"))
        assert _plain.is_plain(connection)
        transaction.rollback()


@case("plain.FINISHED")
@case("plain.TOP")
@case("plain.UNFINISHED")
def _(built: Built, connection: Connection) -> None:
    """Trials 0-3 finished (10 s each, 20 s apart), 4 running, 5 waiting."""
    ids = built.trial_ids
    plain = _plain.PlainStudy(connection, built.study_id, STUDY, now=0.0)
    tally, t0 = plain.tally, T0.timestamp()
    assert tally.states == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 1} and tally.folded == 4
    assert tally.durations == {s: [n, 10.0 * n, 10.0] for s, n in tally.states.items()}
    assert tally.prune_steps == {1: 1} and tally.max_complete_step == 4
    assert tally.best_min == [0.25, 1, ids[1]] and tally.best_max == [1.0, 0, ids[0]]
    assert tally.window == [t0, t0 + 60, t0 + 70]
    assert (tally.watermark, tally.holes) == (ids[5], [ids[4], ids[5]])
    assert plain.ordered("duration", 1, 5, state="COMPLETE") == [10.0]


@case("tally.SUMMARIZE")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    with connection.begin() as transaction:
        one = _tally.trials_since(connection, built.study_id, ids[1] - 1, [])[0]
        assert one.trial_id == ids[1] and not one.summarized
        _tally.summarize(connection, built.study_id, [one])
        again = _tally.trials_since(connection, built.study_id, ids[1] - 1, [])[0]
        assert again.summarized and again.row == one.row and again.flags == one.flags
        transaction.rollback()


@case("tables.ADD_COLUMN")
def _(built: Built, connection: Connection) -> None:
    """On a database of its own: a summary table of an older version gets its new columns."""
    from tests.db.test_summary_migration import check_an_older_database_migrates

    with tempfile.TemporaryDirectory() as folder, _database(built.backend, Path(folder)) as url:
        check_an_older_database_migrates(url)


@case("sql.TABLES")
def _(built: Built, connection: Connection) -> None:
    from hpo_orchestrator.db._sql import has_table

    assert has_table(connection, "hpo_trial_summary") and not has_table(connection, "nope")
    if built.backend == "sqlite":  # status --json's own connection (db/_sql.py)
        with closing(sqlite3.connect(built.url.removeprefix("sqlite:///"))) as plain:
            assert has_table(plain, "hpo_trial_summary") and not has_table(plain, "nope")


@case("tally.EXISTING_IDS")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    assert _tally.existing_ids(connection, 0, ids[5], []) == set(ids.values())
    assert _tally.existing_ids(connection, ids[5], ids[5] + 10, [ids[0], 10**9]) == {ids[0]}


@case("tally.COUNT_UPTO")
@case("tally.COUNT_HOLES")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    assert _tally.summary_count_upto(connection, built.study_id, ids[5], []) == (3, 0)
    assert _tally.summary_count_upto(connection, built.study_id, ids[2], [ids[0], ids[1]]) == (2, 1)


@case("tally.DURATION_WINDOW")
@case("tally.STARTUP_WINDOW")
@case("tally.DECISION_WINDOW")
def _(built: Built, connection: Connection) -> None:
    ids, study = built.trial_ids, built.study_id
    durations = _tally.ordered_window(connection, study, ids[5], [], "duration", 0, 10, "COMPLETE")
    assert durations == [pytest.approx(10.0)]
    assert _tally.ordered_window(connection, study, ids[0], [], "duration", 0, 10, "PRUNED") == []
    assert _tally.ordered_window(connection, study, ids[5], [], "startup_s", 1, 5) == [1.0, 1.0]
    assert _tally.ordered_window(connection, study, ids[5], [ids[0]], "startup_s", 0, 5) == [1.0, 1.0]
    assert _tally.ordered_window(connection, study, ids[2], [], "first_decision_s", 0, 1) == [3.0]


@case("tally.FLAGS_UPTO")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    assert sorted(_tally.flags_upto(connection, built.study_id, ids[5], [])) == [
        (0, False, "PoCL", {"lr": [0.1, 0.2]}, None), (3, None, None, None, "oom")]
    assert [f.number for f in _tally.flags_upto(connection, built.study_id, ids[2], [])] == [0]
    assert [f.number for f in _tally.flags_upto(connection, built.study_id, ids[5], [ids[0]])] == [3]


@case("tally.FAILED_UPTO")
@case("tally.FAIL_ATTRS")
def _(built: Built, connection: Connection) -> None:
    ids = built.trial_ids
    assert _tally.failed_upto(connection, built.study_id, ids[5], []) == [ids[3]]
    assert _tally.failed_upto(connection, built.study_id, ids[5], [ids[3]]) == []
    assert _tally.failed_upto(connection, built.study_id, ids[2], []) == []
    assert _tally.fail_attrs(connection, [ids[3], ids[0]]) == {
        3: {"hpo.fail_reason": "oom", "hpo.retried": True}}


@case("tally.OTHER_STUDIES_ON_GPU")
def _(built: Built, connection: Connection) -> None:
    # summarized on h1 GPU 0: #0 0-10 s, #2 40-50 s, #3 60-70 s; read as another study's,
    # within 5-45 s: 5 s of #0 and 5 s of #2
    lo = T0.timestamp()
    other = built.study_id + 1
    assert _tally.other_studies_busy(connection, other, "h1", 0, lo + 5, lo + 45) == pytest.approx(10)
    assert _tally.other_studies_busy(connection, other, "h1", 1, lo, lo + 100) == 0
    assert _tally.other_studies_busy(connection, built.study_id, "h1", 0, lo, lo + 100) == 0


def test_tally_reads_as_a_visit_of_every_trial(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tally built on this study (trial #1 ended elsewhere: it gets a summary row) gives
    status's numbers, as a visit of every trial does, on both backends; rolled back."""
    from hpo_orchestrator.status import _collect
    from hpo_orchestrator.tally._tally import Tally, advance
    from tests import status_visit

    monkeypatch.setattr(_collect.time, "time", lambda: T0.timestamp() + 500)
    monkeypatch.setattr(status_visit.time, "time", lambda: T0.timestamp() + 500)
    with built.engine.connect() as connection, connection.begin() as transaction:
        full = status_visit.visit(connection, STUDY).to_json()
        assert _collect.collect(connection, STUDY).to_json() == full  # no tally: a fresh fold
        advance(connection, built.study_id, STUDY, rebuild=True)
        stored = _tally.read_tally(connection, built.study_id)
        assert stored is not None
        tally = Tally.from_json(stored[1])
        ids = built.trial_ids
        assert (tally.watermark, tally.holes, tally.folded) == (ids[5], [ids[4], ids[5]], 4)
        assert _tally.summary_count_upto(connection, built.study_id, ids[5], [])[0] == 4
        assert _collect.collect(connection, STUDY).to_json() == full  # the kept tally
        transaction.rollback()


def _statements() -> dict[str, str]:
    """Every ``_X_SQL`` constant of the package, wherever it lives (each feature keeps its
    statements beside it), as '<module>.<X>' -> the module's dotted name."""
    root = Path(hpo_orchestrator.__file__).parent
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__" or parts[1] == "testing":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.startswith("_") and attr.endswith("_SQL") and isinstance(value, str):
                found[f"{parts[-1].lstrip('_')}.{attr.strip('_').removesuffix('_SQL')}"] = name
    return found


def test_every_statement_has_a_case() -> None:
    statements = _statements()
    missing = set(statements) - set(CASES)
    assert not missing, f"statements without a contract case: {sorted(missing)}"
    assert len(statements) >= 30  # the scan found the package's statements
    modules: dict[str, set[str]] = {}
    for key, module in statements.items():
        modules.setdefault(key.split(".")[0], set()).add(module)
    assert all(len(m) == 1 for m in modules.values()), f"one name, two modules: {modules}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_statement(built: Built, name: str) -> None:
    with built.engine.connect() as connection:
        CASES[name](built, connection)


# --- the schema version, checked at open ---------------------------------------------------


def test_installed_optuna_writes_the_known_schema() -> None:
    """A new Optuna migration must be looked at (and added to the db package) before use."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(Path(optuna.storages.__file__).parent / "_rdb" / "alembic"))
    assert script.get_current_head() == db.SCHEMA_REVISION
    assert {r.revision for r in script.walk_revisions()} == {*_version.OLDER_REVISIONS, db.SCHEMA_REVISION}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def optuna_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with one study, made by the installed Optuna."""
    with _database(request.param, tmp_path) as url:
        storage = connect.open_rdb_storage(url)
        optuna.create_study(storage=storage, study_name=STUDY)
        storage.engine.dispose()
        yield url


def _set_revision(url: str, revision: str | None) -> None:
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("DELETE FROM alembic_version"))
        if revision is not None:
            connection.execute(sqlalchemy.text("INSERT INTO alembic_version VALUES (:r)"), {"r": revision})
    engine.dispose()


@pytest.mark.parametrize(("revision", "message", "hint"), [
    ("v9.9.0.a", "has Optuna schema v9.9.0.a .*which this hpo-orchestrator does not know",
     "hpo-orchestrator made for that Optuna"),
    ("v3.0.0.d", "has an older Optuna schema \\(v3.0.0.d\\)", "optuna storage upgrade --storage"),
])
def test_unknown_schema_is_refused_at_open(optuna_url: str, revision: str, message: str, hint: str) -> None:
    _set_revision(optuna_url, revision)
    for open_ in (connect.create_engine, connect.open_rdb_storage):
        with pytest.raises(StorageError, match=message) as raised:
            open_(optuna_url)
        assert raised.value.exit_code == 2 and hint in (raised.value.hint or "")
        assert optuna.__version__ in raised.value.message  # who made it, from version_info


def test_schema_being_stamped_is_let_through(optuna_url: str) -> None:
    """Optuna writes its tables, then version_info, then the alembic stamp: a reader in between
    must not be refused."""
    _set_revision(optuna_url, None)
    connect.create_engine(optuna_url).dispose()


def test_cli_says_unknown_schema_with_hint(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.create_study(storage=url, study_name=STUDY)
    _set_revision(url, "v9.9.0.a")
    for command in (["status"], ["report", "--out", "r.html"], ["tune-pruner"],
                    ["telemetry", "--csv", "-"]):
        proc = subprocess.run([sys.executable, "-m", "hpo_orchestrator", *command, "--storage", url],
                              cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (command, proc.stderr)
        assert "error:" in proc.stderr and "hint:" in proc.stderr and "Traceback" not in proc.stderr
        assert "v9.9.0.a" in proc.stderr
    assert not (tmp_path / "r.html").exists()
