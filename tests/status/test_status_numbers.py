"""status's numbers are the numbers the trials' rows give: a guard for whoever makes status
faster on large studies (what was tried: `git log -p docs/BENCHMARKS.md`, "Status on a large study").

The study mixes what a real one holds: summarized trials on two GPUs of two hosts, overlapping
and with gaps, trials of another tool without a summary row (finished, with hpo.* attrs), and
a running trial that overlaps the summarized ones. The first test is a consistency check of
a large random study: its reference comes from ``db.trial_rows`` (the rows status reads) in the
plainest way (a list of durations, a union of intervals). The second holds known answers: a
small study whose every expected count, duration, busy share, utilization and energy is worked
out by hand, read both from the kept tally and by visiting every trial.
"""

from __future__ import annotations

import random
import statistics
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
from hpo_orchestrator.status import collect_status


def _study(path: Path, summarized: int, seed: int = 7, direction: str = "minimize") -> str:
    url = f"sqlite:///{path}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="big", direction=direction)
    rng = random.Random(seed)
    t0 = datetime.now() - timedelta(seconds=3 * summarized + 60)  # the running trial starts now
    dist = {"x": FloatDistribution(0, 1)}
    rows = []
    for number in range(summarized + 3):
        state = TrialState.PRUNED if rng.random() < 0.4 else TrialState.COMPLETE
        if number % 17 == 5:
            state = TrialState.FAIL
        foreign = number >= summarized  # run by something else: attrs, no summary row
        attrs: dict[str, Any] = {
            "hpo.host": f"h{number % 2}", "hpo.gpu_index": number % 3 % 2,
            "hpo.startup_s": rng.uniform(1, 3), "hpo.first_decision_s": rng.uniform(3, 5),
            "hpo.gpu_util_mean": rng.uniform(20, 90)} if foreign else {}
        study.add_trial(create_trial(
            state=state, value=rng.random() if state == TrialState.COMPLETE else None,
            params={"x": rng.random()}, distributions=dist,
            intermediate_values={s: rng.random() for s in range(rng.randint(1, 4))}, user_attrs=attrs))
        trial_id = study.trials[-1]._trial_id
        start = t0 + timedelta(seconds=rng.uniform(0, 3 * summarized))
        end = start + timedelta(seconds=rng.uniform(1, 40))
        with storage.engine.begin() as connection:
            connection.execute(sqlalchemy.text(
                "UPDATE trials SET datetime_start = :a, datetime_complete = :b WHERE trial_id = :t"),
                {"a": start, "b": end, "t": trial_id})
        if not foreign:
            rows.append({
                "trial_id": trial_id, "study_id": study._study_id, "number": number,
                "state": state.name, "host": f"h{number % 2}", "gpu_index": number % 3 % 2,
                "start_s": start.timestamp(), "end_s": end.timestamp(),
                "startup_s": rng.uniform(1, 3) if number % 4 else None,
                "first_decision_s": rng.uniform(3, 5),
                "last_step": 3, "gpu_util_mean": rng.uniform(20, 90) if number % 5 else None,
                "gpu_util_compute_mean": rng.uniform(20, 90), "gpu_energy_j": rng.uniform(1, 9)})
    running = study.ask()
    running.set_user_attr("hpo.host", "h1")
    running.set_user_attr("hpo.gpu_index", 1)
    running.set_user_attr("hpo.slot", 0)
    tables.ensure_tables(storage.engine)
    with storage.engine.begin() as connection:
        for row in rows:
            tables.insert_summary(connection, row)
    storage.engine.dispose()
    return url


def _union(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    covered, cursor = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, cursor), min(end, hi)
        if end > start:
            covered, cursor = covered + end - start, end
    return covered


@pytest.mark.parametrize("summarized", [0, 41])
def test_status_numbers_are_the_rows_numbers(tmp_path: Path, summarized: int) -> None:
    url = _study(tmp_path / "s.db", summarized)
    engine = connect.create_engine(url)
    with engine.connect() as connection:
        rows = db.trial_rows(connection, 1)
    report = collect_status(engine, "big")

    for state in ("COMPLETE", "PRUNED", "FAIL"):
        durations = [r.end_s - r.start_s for r in rows if r.state == state and r.end_s and r.start_s]
        got = report.states[state]
        assert got.count == sum(1 for r in rows if r.state == state)
        assert got.max_s == (max(durations) if durations else None)
        assert got.median_s == (statistics.median(durations) if durations else None)
        assert got.mean_s == (pytest.approx(statistics.fmean(durations), rel=1e-12) if durations else None)

    now = max(r.end_s or 0 for r in rows)
    starts = [r.start_s for r in rows if r.start_s is not None]
    lo = min(starts)
    assert report.wall_s is not None and report.wall_s >= now - lo  # running: up to now
    hi = lo + report.wall_s
    by_device = {(d.host, d.gpu_index): d for d in report.per_device}
    assert sum(d.trials for d in by_device.values()) == len(rows)
    for (host, gpu), use in by_device.items():
        members = [r for r in rows if (r.host, r.gpu_index) == (host, gpu)]
        intervals = [(r.start_s, r.end_s or hi) for r in members if r.start_s is not None]
        # busy over the time the device's host had a trial running, and up to its last start
        on_host = [(r.start_s, r.end_s or hi) for r in rows if r.host == host and r.start_s is not None]
        host_last_start = max(start for start, _ in on_host)
        assert use.trials == len(members)
        assert use.states == {s: sum(1 for r in members if r.state == s) for s in use.states}
        # a running trial's end is "now", a moment later than the reference's hi: tolerance
        assert use.busy_fraction == pytest.approx(
            _union(intervals, lo, hi) / _union(on_host, lo, hi), abs=1e-3)
        waited = _union(on_host, lo, host_last_start)  # none where all its trials started at once
        assert use.busy_fraction_queued == (pytest.approx(
            _union(intervals, lo, host_last_start) / waited, abs=1e-9) if waited else None)
        timed = [(r.gpu_util_mean, (r.end_s or hi) - r.start_s) for r in members
                 if r.gpu_util_mean is not None and r.start_s is not None]
        weight = sum(w for _, w in timed)
        assert use.util_mean == (pytest.approx(round(sum(u * w for u, w in timed) / weight, 1), abs=0.11)
                                 if weight > 0 else None)
        energy = [r.gpu_energy_j for r in members if r.gpu_energy_j is not None]
        assert use.energy_kj == (pytest.approx(round(sum(energy) / 1000, 3)) if energy else None)

    pairs = [(r.startup_s, r.first_decision_s) for r in rows
             if r.startup_s is not None and r.first_decision_s is not None]
    slow = next((f for f in report.findings if f.code == "slow_startup"), None)
    if len(pairs) >= 3:
        assert slow is not None
        assert slow.evidence["trials"] == len(pairs)
        assert slow.evidence["startup_s_median"] == round(statistics.median(p[0] for p in pairs), 3)
        assert slow.evidence["first_decision_s_median"] == round(statistics.median(p[1] for p in pairs), 3)


# --- the same numbers worked out by hand -----------------------------------------------------

T0 = datetime(2026, 1, 5, 9, 0, 0)
# number: (state, host, gpu, start s, end s, startup_s, first_decision_s, util %, energy J);
# 0-3 have a summary row (the product ran them), 4 only its hpo.* attrs (another tool's run)
HAND = {
    0: ("COMPLETE", "h0", 0, 0.0, 10.0, 1.0, 3.0, 80.0, 1000.0),
    1: ("PRUNED", "h0", 0, 5.0, 12.0, 2.0, 4.0, 40.0, 500.0),
    2: ("COMPLETE", "h0", 1, 2.0, 22.0, 1.5, 3.5, None, None),
    3: ("FAIL", "h1", 0, 30.0, 34.0, None, None, 60.0, 200.0),
    4: ("COMPLETE", "h1", 0, 36.0, 40.0, 2.5, 6.0, 20.0, None),
}


def _hand_study(path: Path, tally: bool) -> str:
    from hpo_orchestrator.tally import advance_tally

    url = f"sqlite:///{path}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="hand")
    dist = {"x": FloatDistribution(0, 1)}
    tables.ensure_tables(storage.engine)
    for number, (state, host, gpu, start, end, startup, decision, util, energy) in HAND.items():
        attrs = {} if number < 4 else {"hpo.host": host, "hpo.gpu_index": gpu,
                                       "hpo.startup_s": startup, "hpo.first_decision_s": decision,
                                       "hpo.gpu_util_mean": util}
        study.add_trial(create_trial(
            state=TrialState[state], value=0.1 * number if state == "COMPLETE" else None,
            params={"x": 0.5}, distributions=dist, intermediate_values={1: 0.5},
            user_attrs=attrs))
        trial_id = study.trials[-1]._trial_id
        began, ended = T0 + timedelta(seconds=start), T0 + timedelta(seconds=end)
        with storage.engine.begin() as connection:
            connection.execute(sqlalchemy.text(
                "UPDATE trials SET datetime_start = :a, datetime_complete = :b WHERE trial_id = :t"),
                {"a": began, "b": ended, "t": trial_id})
            if number < 4:
                tables.insert_summary(connection, {
                    "trial_id": trial_id, "study_id": study._study_id, "number": number,
                    "state": state, "host": host, "gpu_index": gpu, "start_s": began.timestamp(),
                    "end_s": ended.timestamp(), "startup_s": startup, "first_decision_s": decision,
                    "last_step": 1, "gpu_util_mean": util, "gpu_util_compute_mean": util,
                    "gpu_energy_j": energy})
    if tally:
        with storage.engine.begin() as connection:
            advance_tally(connection, study._study_id, "hand", rebuild=True)
    storage.engine.dispose()
    return url


@pytest.mark.parametrize("tally", [False, True])
def test_status_numbers_of_a_small_study_by_hand(tmp_path: Path, tally: bool) -> None:
    """Five trials on three GPUs of two hosts, times in seconds from the first start (0 to
    40), every expected number worked out by hand from the table HAND; from the study's kept
    tally and from a fresh fold of every trial (no tally), through SQLAlchemy and through the
    plain sqlite3 reader."""
    import sqlite3

    from hpo_orchestrator.status import collect_status_sqlite

    url = _hand_study(tmp_path / "hand.db", tally)
    _check_hand(collect_status(connect.create_engine(url), "hand"))
    with sqlite3.connect(tmp_path / "hand.db") as connection:
        kept = collect_status_sqlite(connection, "hand")
    _check_hand(kept)


def _check_hand(report: Any) -> None:
    # COMPLETE: 10, 20 and 4 s; PRUNED: 7 s; FAIL: 4 s
    complete = report.states["COMPLETE"]
    assert (complete.count, complete.max_s, complete.median_s) == (3, 20.0, 10.0)
    assert complete.mean_s == pytest.approx(34.0 / 3)
    pruned, failed = report.states["PRUNED"], report.states["FAIL"]
    assert (pruned.count, pruned.max_s, pruned.median_s, pruned.mean_s) == (1, 7.0, 7.0, 7.0)
    assert (failed.count, failed.max_s, failed.median_s, failed.mean_s) == (1, 4.0, 4.0, 4.0)
    assert report.wall_s == pytest.approx(40.0)  # first start 0, last end 40

    by = {(d.host, d.gpu_index): d for d in report.per_device}
    assert set(by) == {("h0", 0), ("h0", 1), ("h1", 0)}
    # Busy is a share of the time its host had a trial running: h0 from 0 to 22 (22 s, 5 s
    # before its last start, 5), h1 30-34 and 36-40 (8 s, 4 s before its last start, 36).
    # The study ran on two hosts: no one time with trials running for the header.
    assert report.active_s is None
    # h0 GPU 0: 0-10 and 5-12 overlap: busy 12 s of 22; before h0's last start 5 s of 5;
    # utilization weighted by duration (80 x 10 + 40 x 7) / 17 = 63.53; 1.5 kJ
    gpu = by[("h0", 0)]
    assert (gpu.trials, gpu.states) == (2, {"COMPLETE": 1, "PRUNED": 1})
    assert (gpu.active_s, gpu.active_queued_s) == (pytest.approx(22), pytest.approx(5))
    assert gpu.busy_fraction == pytest.approx(12 / 22)
    assert gpu.busy_fraction_queued == pytest.approx(5 / 5)
    assert (gpu.util_mean, gpu.energy_kj) == (63.5, 1.5)
    # h0 GPU 1: 2-22: 20 s of 22; 3 s of the 5 before h0's last start; no utilization or
    # energy recorded
    gpu = by[("h0", 1)]
    assert gpu.trials == 1 and gpu.busy_fraction == pytest.approx(20 / 22)
    assert gpu.busy_fraction_queued == pytest.approx(3 / 5)
    assert (gpu.util_mean, gpu.energy_kj) == (None, None)
    # h1 GPU 0: 30-34 and 36-40: 8 s of h1's 8; 4 s of the 4 before its last start;
    # (60 x 4 + 20 x 4) / 8; energy from the summarized trial only (200 J)
    gpu = by[("h1", 0)]
    assert (gpu.trials, gpu.states) == (2, {"FAIL": 1, "COMPLETE": 1})
    assert (gpu.active_s, gpu.active_queued_s) == (pytest.approx(8), pytest.approx(4))
    assert gpu.busy_fraction == pytest.approx(8 / 8)
    assert gpu.busy_fraction_queued == pytest.approx(4 / 4)
    assert (gpu.util_mean, gpu.energy_kj) == (40.0, 0.2)

    # slow start-up: the 4 trials with both times: start-ups 1, 2, 1.5, 2.5 (median 1.75),
    # first decisions 3, 4, 3.5, 6 (median 3.75): 47 % of it, above the finding's 25 %
    slow = next(f for f in report.findings if f.code == "slow_startup")
    assert slow.evidence == {"startup_s_median": 1.75, "first_decision_s_median": 3.75,
                             "share": round(1.75 / 3.75, 3), "trials": 4}
