"""The parts of status's collection (status/_collect.py) and of its report (status/_model.py),
each held to its docstring with small inputs made by hand: what ``status`` and ``status --json``
show is these parts' output."""

from __future__ import annotations

import gc
import json
from contextlib import closing
from dataclasses import asdict, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

import hpo_orchestrator.db as db
from hpo_orchestrator import keys
from hpo_orchestrator.db import SummaryFlags, TrialRow, connect, tables
from hpo_orchestrator.status import _collect
from hpo_orchestrator.status._findings import IDLE_BUSY_BELOW
from hpo_orchestrator.status._model import DeviceUse, StateStats, StatusReport
from hpo_orchestrator.tally import SinceTrial, Tally, advance_tally


def _report(**changes: object) -> StatusReport:
    report = StatusReport(study="s", direction="minimize", n_trials_target=None,
                          states={"PRUNED": StateStats(count=3)}, prune_rate=1.0,
                          prune_steps={3: 2, 10: 1}, best=None, per_device=[], running=[])
    for name, value in changes.items():
        setattr(report, name, value)
    return report


def test_the_json_report_holds_every_field_and_names_each_prune_step() -> None:
    """``status --json`` prints to_json(): every field of the report, under its own name, the
    steps trials were pruned at as JSON's keys (strings) with their counts."""
    data = _report().to_json()
    assert set(data) == {f.name for f in fields(StatusReport)}
    assert data["prune_steps"] == {"3": 2, "10": 1}
    assert json.loads(json.dumps(data))["prune_steps"] == {"3": 2, "10": 1}


def _row(number: int, state: str = "RUNNING", host: str | None = "h1", gpu: int | None = 0,
         start: float | None = 100.0, end: float | None = None, **kw: Any) -> TrialRow:
    values: dict[str, Any] = dict(number=number, state=state, host=host, gpu_index=gpu, start_s=start,
                                  end_s=end, startup_s=None, first_decision_s=None, gpu_util_mean=None,
                                  gpu_util_compute_mean=None, gpu_energy_j=None, last_step=None)
    values.update(kw)
    return TrialRow(**values)


def test_the_cycle_collector_is_paused_while_rows_are_built_then_as_it_was() -> None:
    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with _collect._cycle_collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
    finally:
        (gc.enable if was else gc.disable)()


def _two_studies(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'two.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for name, n in (("a", 1), ("b", 2)):
        study = optuna.create_study(study_name=name, storage=url)
        for _ in range(n):
            study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    return url


def test_status_over_sqlite3_reads_the_study_named_in_one_transaction(tmp_path: Path) -> None:
    """collect_status_sqlite: the named study of several, read in one transaction that it
    ends (the connection is left as it was given)."""
    with closing(db.open_sqlite(_two_studies(tmp_path))) as connection:
        assert connection is not None and not connection.in_transaction
        report = _collect.collect_status_sqlite(connection, "b")
        assert not connection.in_transaction
    assert (report.study, report.states["COMPLETE"].count) == ("b", 2)


def test_a_running_trial_as_status_shows_it() -> None:
    entry = _collect._running_entry(_row(4, host="h2", gpu=1, start=100.0, last_step=7),
                                    {keys.SETUP_RUNNING: True}, 31.0, 30.0, 160.0, False, 2)
    assert entry == {"number": 4, "host": "h2", "device": "h2:gpu1", "elapsed_s": 60.0,
                     "last_step": 7, "heartbeat_age_s": 31.0, "stale": True, "grace_s": 30.0,
                     "outside": False, "setup_running": True}
    entry = _collect._running_entry(_row(5, start=None), {keys.SETUP_RUNNING: "yes"}, 30.0, 30.0,
                                    160.0, True, 2)
    assert (entry["device"], entry["elapsed_s"], entry["stale"], entry["outside"],
            entry["setup_running"]) == ("outside", None, False, True, False)
    entry = _collect._running_entry(_row(6), {}, None, 30.0, 160.0, False, 1)
    assert (entry["device"], entry["stale"], entry["heartbeat_age_s"]) == ("gpu0", False, None)


NOW = datetime(2026, 1, 1, 12, 0, 0)


def _running(monkeypatch: pytest.MonkeyPatch, beats: dict[int, float | None],
             trials: list[db.UncoveredTrial], config: dict[str, Any],
             db_now: datetime | None = NOW) -> tuple[list[dict[str, Any]], list[int]]:
    """running_of with each trial's heartbeat ``beats[trial_id]`` seconds before ``db_now``."""
    def heartbeat_of(_connection: Any, trial_id: int) -> datetime | None:
        age = beats.get(trial_id)
        return None if age is None else NOW - timedelta(seconds=age)

    monkeypatch.setattr(db, "heartbeat_of", heartbeat_of)
    return _collect.running_of(None, trials, db_now, 1000.0, config, 1)  # type: ignore[arg-type]


def _uncovered(trial_id: int, state: str = "RUNNING", **attrs: Any) -> db.UncoveredTrial:
    return db.UncoveredTrial(trial_id, _row(trial_id, state=state), {keys.HOST: "h1", **attrs})


@pytest.mark.parametrize(("storage", "grace"), [
    ({}, 30.0), ({"heartbeat_interval_s": 5}, 15.0), ({"grace_period_s": 7, "heartbeat_interval_s": 5}, 7.0),
    ({"grace_period_s": None, "heartbeat_interval_s": None}, 30.0)])
def test_a_heartbeat_is_stale_past_the_grace_period(monkeypatch: pytest.MonkeyPatch,
                                                    storage: dict[str, Any], grace: float) -> None:
    """The grace: storage.grace_period_s, else 3 heartbeat intervals (10 s by default); a
    heartbeat exactly that old is not stale yet, the database's clock against its own."""
    trials = [_uncovered(1, **{keys.SLOT: 0}), _uncovered(2, **{keys.SLOT: 0})]
    running, queued = _running(monkeypatch, {1: grace, 2: grace + 0.5}, trials, {"storage": storage})
    assert [(r["number"], r["grace_s"], r["heartbeat_age_s"], r["stale"]) for r in running] == [
        (1, grace, grace, False), (2, grace, grace + 0.5, True)]
    assert queued == []


def test_the_running_ones_by_number_and_those_only_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only RUNNING trials, by number; one with no slot yet (asked ahead) is queued unless its
    heartbeat is stale; one no orchestrator asked is ``outside``, never queued; a database
    clock unknown leaves every age unknown. Outside: none of an orchestrator's attrs and no
    heartbeat (one that beats is a run's, queued here as it has no slot)."""
    trials = [_uncovered(5, **{keys.SLOT: 1}), _uncovered(3), _uncovered(4, state="COMPLETE"),
              _uncovered(2), db.UncoveredTrial(6, _row(6), {}), _uncovered(1, **{keys.SLOT: None}),
              db.UncoveredTrial(7, _row(7), {})]
    beats = {5: 1.0, 3: 100.0, 2: 1.0, 1: 1.0, 7: 1.0}
    running, queued = _running(monkeypatch, beats, trials, {"storage": {}})
    assert queued == [1, 2, 7]
    assert [(r["number"], r["device"], r["stale"], r["outside"]) for r in running] == [
        (3, "gpu0", True, False), (5, "gpu0", False, False), (6, "outside", False, True)]
    running, queued = _running(monkeypatch, beats, trials, {"storage": {}}, db_now=None)
    assert queued == [1, 2, 3, 7] and [r["heartbeat_age_s"] for r in running] == [None, None]


def test_without_a_config_no_trial_is_taken_for_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """A study no orchestrator configured (no hpo.config) has no slots: its trials run."""
    running, queued = _running(monkeypatch, {1: 1.0}, [_uncovered(1)], {})
    assert queued == [] and [r["number"] for r in running] == [1]


@pytest.mark.parametrize(("host", "gpu", "hosts", "label"), [
    ("h1", 0, 1, "gpu0"), ("h1", None, 1, "cpu"), ("h1", 2, 2, "h1:gpu2"), ("h1", None, 3, "h1:cpu"),
    (None, 1, 2, "gpu1")])
def test_a_device_is_named_with_its_host_where_the_study_ran_on_several(
        host: str | None, gpu: int | None, hosts: int, label: str) -> None:
    assert _collect.device_label(host, gpu, hosts) == label


def test_the_devices_each_orchestrator_listed_by_host() -> None:
    attrs = {"hpo.devices.h1": [{"index": 0}, {"index": 1}], "hpo.devices.h2": None,
             "hpo.devicesX": [{"index": 5}], "hpo.packing.h1": {"a": 1}}
    assert _collect.listed_devices(attrs) == {"h1": [{"index": 0}, {"index": 1}], "h2": []}


def test_the_attrs_of_every_host_each_with_its_host_named() -> None:
    """<prefix><host> of each host, by host, with "host" added; another shape is left out."""
    attrs = {"hpo.packing.h2": {"trials_per_gpu": 2}, "hpo.packing.h1": {"trials_per_gpu": 3},
             "hpo.packing.h3": [1, 2], "hpo.device_choice.h1": {"learner": "x"}}
    assert _collect._per_host(attrs, keys.PACKING_PREFIX) == [
        {"host": "h1", "trials_per_gpu": 3}, {"host": "h2", "trials_per_gpu": 2}]


def test_unreadable_study_attrs_are_named_in_a_warning() -> None:
    report = _collect._note_unreadable(_report(), ["hpo.config", "hpo.packing.h1"])
    assert [asdict(f) for f in report.findings] == [{
        "code": "unreadable_attr", "severity": "warning",
        "message": "study attrs of a shape this package never writes were left out: "
                   "hpo.config, hpo.packing.h1",
        "advice": "something else wrote them (optuna study set-user-attr, another program on a "
                  "shared database); the rest of the study reads as usual",
        "evidence": {"attrs": ["hpo.config", "hpo.packing.h1"]}}]
    assert _collect._note_unreadable(_report(), []).findings == []


def test_failures_count_each_fail_trial_once_as_it_ran() -> None:
    """A trial asked ahead and put back before a slot took it (retried, no hpo.pid) never ran;
    a retried one that ran is a re-run attempt (its reason counted, not listed); the others
    are listed by number with their reason and error."""
    failures = _collect.failures_of({
        9: {keys.FAIL_REASON: "oom", keys.ERROR: "CUDA out of memory", keys.PID: 1},
        3: {keys.RETRIED: True, keys.PID: 2, keys.FAIL_REASON: "killed"},
        4: {keys.RETRIED: True},
        5: {keys.RETRIED: True, keys.FAIL_REASON: "lost"},
        2: {keys.RETRIED: "true", keys.PID: 3},
        7: {keys.FAIL_REASON: "oom", keys.PID: 4},
        8: {keys.FAIL_REASON: "", keys.PID: 5}})
    assert failures == _collect.Failures(
        listed=[(2, None, None), (7, "oom", None), (8, "", None), (9, "oom", "CUDA out of memory")],
        rerun=1, reasons={"killed": 1, "oom": 2}, never_ran=2)
    assert list(failures.reasons) == ["killed", "oom"]
    assert _collect.failures_of({}) == _collect.Failures([], 0, {}, 0)


def _flags(number: int, verified: bool | None = None, platform: str | None = None,
           mismatch: dict[str, Any] | None = None) -> SummaryFlags:
    return SummaryFlags(number, verified, platform, mismatch, None)


def test_the_trials_flagged_gpu_unused_or_params_differ_by_number() -> None:
    flags = [_flags(5, False, "NVIDIA CUDA"), _flags(1, True), _flags(2, None), _flags(3, False),
             _flags(4, mismatch={"x": [1, 2]}), _flags(0, mismatch={})]
    assert _collect._unverified(flags) == [(3, None), (5, "NVIDIA CUDA")]
    assert _collect._mismatches(flags) == [(4, {"x": [1, 2]})]
    assert _collect._mismatches([*flags, _flags(2, mismatch={"y": [0, 1]})]) == [
        (2, {"y": [0, 1]}), (4, {"x": [1, 2]})]


def test_trials_asked_ahead_count_as_queued_not_running() -> None:
    tally = Tally(states={"RUNNING": 5, "COMPLETE": 2})
    assert _collect._counts(tally, [7, 8]) == {"RUNNING": 3, "COMPLETE": 2, "QUEUED": 2}
    assert _collect._counts(tally, []) == {"RUNNING": 5, "COMPLETE": 2}
    assert tally.states == {"RUNNING": 5, "COMPLETE": 2}


def _stored_window(stored: dict[tuple[str, str | None], list[float]]) -> Any:
    """A stand-in for ordered_window: ``stored[(what, state)]``, in order."""
    def window(what: str, offset: int, limit: int, state: str | None = None) -> list[float]:
        return stored.get((what, state), [])[offset:offset + limit]
    return window


def test_each_states_count_mean_median_and_longest_the_usual_states_first() -> None:
    """The mean and longest of the tally's sums (every trial), the median of the stored
    durations and the trials' since; a state without durations has none; a state beyond the
    usual six comes after them, by name."""
    tally = Tally(durations={"COMPLETE": [3, 14.0, 7.0], "FAIL": [1, 2.0, 2.0]})
    window = _stored_window({("duration", "COMPLETE"): [3.0, 7.0], ("duration", "FAIL"): [2.0]})
    counts = {"COMPLETE": 3, "FAIL": 1, "RUNNING": 1, "ZOMBIE": 2, "ODD": 1}
    states = _collect._state_stats(tally, counts, window, {"COMPLETE": 2, "FAIL": 1},
                                   {"COMPLETE": [4.0]})
    assert list(states) == ["COMPLETE", "PRUNED", "FAIL", "RUNNING", "QUEUED", "WAITING", "ODD", "ZOMBIE"]
    assert states["COMPLETE"] == StateStats(count=3, mean_s=14.0 / 3, median_s=4.0, max_s=7.0)
    assert states["FAIL"] == StateStats(count=1, mean_s=2.0, median_s=2.0, max_s=2.0)
    assert states["PRUNED"] == StateStats(count=0)
    assert states["ZOMBIE"] == StateStats(count=2)


@pytest.mark.parametrize(("folded", "pairs", "expected"), [
    (0, [], None), (0, [(1.0, 5.0), (3.0, 9.0)], (2, 2.0, 7.0)),
    (2, [(3.0, 9.0)], (3, 2.0, 6.0)), (1, [], (1, 1.5, 5.5)), (1, [(3.0, 9.0)], (2, 2.25, 7.25))])
def test_the_startup_medians_of_the_trials_with_both_times(
        folded: int, pairs: list[tuple[float, float]], expected: tuple[int, float, float] | None) -> None:
    """(trials, median start-up, median first decision) of the folded trials' pairs and the
    ones since; None without a pair."""
    stored = {("startup_s", None): [1.0, 2.0][:folded] if folded != 1 else [1.5],
              ("first_decision_s", None): [5.0, 6.0][:folded] if folded != 1 else [5.5]}
    assert _collect._startup(_stored_window(stored), folded, pairs) == expected


def test_the_trials_since_folded_in_with_their_durations_and_pairs() -> None:
    """Durations by state of the trials with both times, the (start-up, first decision) pairs
    of those with both, each trial folded into the tally: a queued one on no device."""
    tally = Tally()
    since = [
        SinceTrial(1, _row(0, "COMPLETE", start=0.0, end=10.0, startup_s=1.0, first_decision_s=3.0),
                   _flags(0), {}, 0.5, True),
        SinceTrial(2, _row(1, "COMPLETE", start=None, end=10.0, startup_s=1.0), _flags(1), {}, 0.7, True),
        SinceTrial(3, _row(2, "RUNNING", gpu=1, start=5.0), _flags(2), {}, None, False),
        SinceTrial(4, _row(3, "RUNNING", gpu=2, start=6.0, first_decision_s=2.0), _flags(3), {}, None, False)]
    durations, pairs = _collect._fold_since(tally, since, [3], now=20.0)
    assert durations == {"COMPLETE": [10.0]} and pairs == [(1.0, 3.0)]
    assert tally.states == {"COMPLETE": 2, "RUNNING": 2}
    assert sorted((d.host, d.gpu_index) for d in tally.devices) == [("h1", 0), ("h1", 1)]
    assert tally.best_min == [0.5, 0, 1]


def _tally_of(rows: list[TrialRow], now: float = 1000.0) -> Tally:
    tally = Tally()
    for trial_id, row in enumerate(rows, 1):
        tally.add(trial_id, row, None, now)
    return tally


def test_each_devices_busy_share_of_its_hosts_active_time() -> None:
    """A device's busy share is over the time its host had a trial running, and, while trials
    waited, up to the host's last start; a listed GPU without a trial was idle; its trials'
    utilization (trial-time weighted, to 0.1) and energy (kJ, to 0.001)."""
    tally = _tally_of([
        _row(0, "COMPLETE", gpu=0, start=0.0, end=100.0, gpu_util_mean=40.0,
             gpu_util_compute_mean=50.0, gpu_energy_j=1234.5678),
        _row(1, "PRUNED", gpu=0, start=10.0, end=60.0, gpu_util_mean=10.0 + 1 / 3,
             gpu_util_compute_mean=None, gpu_energy_j=None),
        _row(2, "COMPLETE", gpu=1, start=50.0, end=150.0)])
    uses = {u.device: u for u in _collect._device_use(tally, {"h1": [{"index": 2}, {"index": 0}]})}
    assert list(uses) == ["gpu0", "gpu1", "gpu2"]
    gpu0, gpu1, gpu2 = uses["gpu0"], uses["gpu1"], uses["gpu2"]
    assert (gpu0.active_s, gpu0.active_queued_s) == (150.0, 50.0)
    assert (gpu0.busy_fraction, gpu0.busy_fraction_queued) == (100.0 / 150.0, 1.0)
    assert (gpu0.trials, gpu0.states) == (2, {"COMPLETE": 1, "PRUNED": 1})
    assert (gpu0.util_mean, gpu0.util_compute_mean, gpu0.energy_kj) == (
        round((40.0 * 100 + (10.0 + 1 / 3) * 50) / 150, 1), 50.0, 1.235)
    assert (gpu1.busy_fraction, gpu1.busy_fraction_queued, gpu1.trials) == (100.0 / 150.0, 0.0, 1)
    assert (gpu1.util_mean, gpu1.util_compute_mean, gpu1.energy_kj) == (None, None, None)
    assert (gpu2.busy_fraction, gpu2.busy_fraction_queued, gpu2.trials, gpu2.states) == (0.0, 0.0, 0, {})
    assert (gpu2.active_s, gpu2.util_mean) == (150.0, None)


def test_devices_of_several_hosts_and_of_a_host_no_trial_ran_on() -> None:
    """Labelled with their hosts (those of the trials on devices and the listed ones); a host
    whose orchestrator listed its GPUs but ran no trial has no busy share; no trial started
    at all: the listed devices only, nothing measured."""
    tally = _tally_of([_row(0, "COMPLETE", gpu=0, start=0.0, end=10.0),
                       _row(1, "COMPLETE", host="h0", gpu=None, start=0.0, end=5.0)])
    uses = _collect._device_use(tally, {"h2": [{"index": 0}]})
    assert [(u.device, u.busy_fraction, u.trials) for u in uses] == [
        ("h0:cpu", 1.0, 1), ("h1:gpu0", 1.0, 1), ("h2:gpu0", None, 0)]
    listed = {"h1": [{"index": 1}, {"index": 0}], "h0": []}
    assert [(u.device, u.active_s) for u in _collect._device_use(Tally(), listed)] == [
        ("h1:gpu0", None), ("h1:gpu1", None)]


def test_a_device_of_a_trial_that_started_and_ended_at_once_has_no_share() -> None:
    """A host whose trials took no time has no active time: no share (not a division by 0)."""
    tally = _tally_of([_row(0, "FAIL", gpu=0, start=5.0, end=5.0)])
    use = _collect._device_use(tally, {})[0]
    assert (use.active_s, use.busy_fraction, use.busy_fraction_queued, use.trials) == (0.0, None, None, 1)


def test_other_studies_are_read_for_the_gpus_left_idle_while_trials_waited(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only GPUs (of a named host where the study ran) busy under IDLE_BUSY_BELOW while trials
    waited, from the study's first start to that host's last start."""
    calls: list[tuple[Any, ...]] = []

    def busy(connection: Any, study_id: int, host: str, gpu: int, lo: float, hi: float) -> float:
        calls.append((connection, study_id, host, gpu, lo, hi))
        return 7.0

    monkeypatch.setattr(_collect, "other_studies_busy", busy)
    tally = _tally_of([_row(0, "COMPLETE", host="h1", gpu=0, start=10.0, end=20.0),
                       _row(1, "COMPLETE", host="h2", gpu=0, start=12.0, end=30.0),
                       _row(2, "COMPLETE", host="h1", gpu=1, start=15.0, end=18.0)])
    uses = [DeviceUse("a", "h1", 0, busy_fraction_queued=0.74),
            DeviceUse("b", "h1", 1, busy_fraction_queued=IDLE_BUSY_BELOW),
            DeviceUse("c", "h2", 0, busy_fraction_queued=0.0),
            DeviceUse("d", "h2", None, busy_fraction_queued=0.1),
            DeviceUse("e", "h3", 0, busy_fraction_queued=0.1), DeviceUse("f", "h1", 2)]
    report = _report(per_device=uses)
    assert _collect._other_studies_on_idle_gpus("conn", 4, report, tally) == {  # type: ignore[arg-type]
        ("h1", 0): 7.0, ("h2", 0): 7.0}
    assert calls == [("conn", 4, "h1", 0, 10.0, 15.0), ("conn", 4, "h2", 0, 10.0, 12.0)]
    assert _collect._other_studies_on_idle_gpus("conn", 4, report, Tally()) == {}  # type: ignore[arg-type]


def test_a_multi_objective_study_reports_its_pareto_front(tmp_path: Path) -> None:
    """With several objectives ``best`` is None and ``best_trials`` holds the Pareto front
    ({number, values, params}, as Optuna's study.best_trials); with one, best_trials is empty."""
    url = f"sqlite:///{tmp_path / 'mo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="mo", storage=url, directions=["minimize", "maximize"])
    for x, values in ((0.1, [1.0, 1.0]), (0.2, [2.0, 3.0]), (0.3, [2.0, 0.5])):
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=values, params={"x": x},
                                     distributions={"x": FloatDistribution(0, 1)}))
    single = optuna.create_study(study_name="one", storage=url)
    single.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    with closing(db.open_sqlite(url)) as connection:
        report = _collect.collect_status_sqlite(connection, "mo")
        one = _collect.collect_status_sqlite(connection, "one")
    assert (report.best, report.direction, report.directions) == (None, "minimize", ["minimize", "maximize"])
    assert sorted(report.best_trials, key=lambda t: t["number"]) == [
        {"number": 0, "values": [1.0, 1.0], "params": {"x": 0.1}},
        {"number": 1, "values": [2.0, 3.0], "params": {"x": 0.2}}]
    assert one.best_trials == [] and one.best is not None and one.directions == ["minimize"]


def _assembled(tally: Tally, counts: dict[str, int], config: dict[str, Any],
               study_attrs: dict[str, Any], failures: _collect.Failures) -> StatusReport:
    states = {s: StateStats(count=n) for s, n in counts.items()}
    return _collect._assembled(None, 1, "s", ["maximize"], study_attrs, config, tally,  # type: ignore[arg-type]
                               states, counts, {}, [{"number": 9}], [8], failures)


def test_the_reports_fields_from_the_tally_the_config_and_the_study_attrs() -> None:
    """n_trials from study.n_trials, the prune rate of the finished trials, the wall time from
    the first start to the last end, the active time of a study on one host, pruner.tune=auto,
    the attrs of min_resource=auto, the pruner's switches and tuning, per host packing and
    device choice, and the latest failed trial that was not interrupted."""
    tally = _tally_of([_row(0, "COMPLETE", start=10.0, end=20.0), _row(1, "PRUNED", start=30.0, end=45.0)])
    tally.prune_steps = {5: 1, 2: 3}
    attrs = {keys.PRUNER_MIN_RESOURCE_AUTO: {"min_resource": 3}, keys.PRUNER_HISTORY: [{"to": "x"}],
             keys.PRUNER_TUNING: {"verdict": "keep"}, keys.PACKING_PREFIX + "h1": {"trials_per_gpu": 2},
             keys.DEVICE_CHOICE_PREFIX + "h1": {"learner": "gpu"}}
    failures = _collect.Failures(
        [(3, "interrupted", None), (5, "oom", "e"), (4, None, None), (6, "interrupted", None)],
        2, {"oom": 1}, 1)
    report = _assembled(tally, {"COMPLETE": 2, "PRUNED": 1, "FAIL": 4, "RUNNING": 1},
                        {"study": {"n_trials": 50}, "pruner": {"tune": "auto"}}, attrs, failures)
    assert (report.study, report.direction, report.directions, report.n_trials_target) == (
        "s", "maximize", ["maximize"], 50)
    assert (report.prune_rate, report.prune_steps, list(report.prune_steps)) == (1 / 7, {2: 3, 5: 1}, [2, 5])
    assert (report.wall_s, report.active_s, report.best, report.best_trials) == (35.0, 25.0, None, [])
    assert (report.running, report.queued, report.fail_reasons) == ([{"number": 9}], [8], {"oom": 1})
    assert (report.retried, report.never_ran, report.last_failed) == (2, 1, 5)
    assert (report.min_resource_auto, report.pruner_tune, report.pruner_history, report.pruner_tuning) == (
        {"min_resource": 3}, True, [{"to": "x"}], {"verdict": "keep"})
    assert (report.packing, report.device_choices) == (
        [{"host": "h1", "trials_per_gpu": 2}], [{"host": "h1", "learner": "gpu"}])
    assert [(u.device, u.trials) for u in report.per_device] == [("gpu0", 2)]


def test_a_report_without_finished_trials_config_or_attrs() -> None:
    """No finished trial: no prune rate; no trial started: no wall or active time; no config:
    no target, no pruner.tune; no attrs: none of theirs; only interrupted failures: none latest."""
    report = _assembled(Tally(), {"RUNNING": 1}, {}, {}, _collect.Failures([(3, "interrupted", None)], 0, {}))
    assert (report.n_trials_target, report.prune_rate, report.wall_s, report.active_s) == (None,) * 4
    assert (report.pruner_tune, report.pruner_history, report.pruner_tuning, report.min_resource_auto) == (
        False, [], None, None)
    assert (report.last_failed, report.packing, report.device_choices) == (None, [], [])
    tune = _assembled(Tally(), {}, {"pruner": {"tune": "off"}, "study": {}}, {keys.PRUNER_HISTORY: None},
                      _collect.Failures([], 0, {}))
    assert (tune.pruner_tune, tune.pruner_history, tune.n_trials_target) == (False, [], None)
    assert _assembled(Tally(), {}, {"pruner": None}, {}, _collect.Failures([], 0, {})).pruner_tune is False


def test_the_active_time_of_a_study_on_several_hosts_is_not_one_union() -> None:
    tally = _tally_of([_row(0, "COMPLETE", start=10.0, end=20.0),
                       _row(1, "COMPLETE", host="h2", start=30.0, end=45.0)])
    report = _assembled(tally, {"COMPLETE": 2}, {}, {}, _collect.Failures([], 0, {}))
    assert (report.wall_s, report.active_s, report.prune_rate) == (35.0, None, 0.0)


def test_a_host_active_under_a_second_still_gives_its_devices_shares() -> None:
    """Any active time divides (a trial of half a second, a last start half a second in), and
    any measured time gives a mean utilization."""
    tally = _tally_of([_row(0, "COMPLETE", gpu=0, start=0.0, end=0.5, gpu_util_mean=40.0,
                            gpu_util_compute_mean=60.0),
                       _row(1, "COMPLETE", gpu=1, start=0.25, end=0.5)])
    gpu0, gpu1 = _collect._device_use(tally, {})
    assert (gpu0.active_s, gpu0.active_queued_s) == (0.5, 0.25)
    assert (gpu0.busy_fraction, gpu0.busy_fraction_queued) == (1.0, 1.0)
    assert (gpu1.busy_fraction, gpu1.busy_fraction_queued) == (0.5, 0.0)
    assert (gpu0.util_mean, gpu0.util_compute_mean, gpu1.util_mean) == (40.0, 60.0, None)


def test_a_study_without_direction_rows_reads_as_optunas_default(tmp_path: Path) -> None:
    """A study whose direction rows are gone (a database edited by hand) reads as minimized,
    Optuna's default direction."""
    url = _two_studies(tmp_path)
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("DELETE FROM study_directions"))
    engine.dispose()
    with closing(db.open_sqlite(url)) as connection:
        report = _collect.collect_status_sqlite(connection, "b")
    assert (report.direction, report.directions) == ("minimize", ["minimize"])
    assert report.best is not None and report.best["value"] == 1.0


def test_a_kept_tally_of_one_trial_gives_its_failure(tmp_path: Path) -> None:
    """The failures of the trials a kept tally folded are read from their summary rows: a
    tally of a single failed trial names it as the latest failed, with its reason."""
    url = f"sqlite:///{tmp_path / 'one.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="one", storage=url)
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={
        keys.HOST: "h1", keys.PID: 1, keys.FAIL_REASON: "oom", keys.ERROR: "CUDA out of memory"}))
    engine = connect.create_engine(url, read_only=False)
    tables.ensure_tables(engine)
    with engine.begin() as connection:
        advance_tally(connection, 1, "one", rebuild=True)
    with engine.connect() as connection:
        kept = _collect._kept_tally(connection, 1, "one")
    engine.dispose()
    assert kept is not None and kept.folded == 1
    with closing(db.open_sqlite(url)) as connection:
        report = _collect.collect_status_sqlite(connection, "one")
    assert (report.fail_reasons, report.last_failed) == ({"oom": 1}, 0)
