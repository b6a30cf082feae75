"""status's numbers are the numbers the trials' rows give: a guard for whoever makes status
faster on large studies (what was tried: `git log -p docs/BENCHMARKS.md`, "Status on a large study").

The study mixes what a real one holds: summarized trials on two GPUs of two hosts, overlapping
and with gaps, trials of another tool without a summary row (finished, with hpo.* attrs), and
a running trial that overlaps the summarized ones. The reference is computed here, from the
trials' rows, in the plainest way (a list of durations, a union of intervals).
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
    lo, queued_hi = min(starts), max(starts)
    assert report.wall_s is not None and report.wall_s >= now - lo  # running: up to now
    hi = lo + report.wall_s
    by_device = {(d.host, d.gpu_index): d for d in report.per_device}
    assert sum(d.trials for d in by_device.values()) == len(rows)
    for (host, gpu), use in by_device.items():
        members = [r for r in rows if (r.host, r.gpu_index) == (host, gpu)]
        intervals = [(r.start_s, r.end_s or hi) for r in members if r.start_s is not None]
        assert use.trials == len(members)
        assert use.states == {s: sum(1 for r in members if r.state == s) for s in use.states}
        # a running trial's end is "now", a moment later than the reference's hi: tolerance
        assert use.busy_fraction == pytest.approx(_union(intervals, lo, hi) / (hi - lo), abs=1e-3)
        assert use.busy_fraction_queued == pytest.approx(
            _union(intervals, lo, queued_hi) / (queued_hi - lo), abs=1e-9)
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
