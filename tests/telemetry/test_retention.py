"""Telemetry retention (telemetry/_retention.py): each pass looks at this
host's trials ended since the last one (a cursor on their end time), at most _BATCH of them,
so that over several passes every old trial is averaged down once, however many there are,
and none is read again; a trial ended less than keep_full_s ago, or on another host, keeps
every sample. A bucket holds one GPU's consecutive samples: utilization and power as means,
memory and temperature as peaks, the first timestamp."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy

import hpo_orchestrator.telemetry._retention as retention_module
from hpo_orchestrator.db import tables
from hpo_orchestrator.telemetry import TelemetryRetention

optuna.logging.set_verbosity(optuna.logging.WARNING)
SAMPLES = 10  # per GPU per trial
KEEP_S = 60.0


def _rows(engine: sqlalchemy.Engine) -> dict[int, dict[int | None, list[tuple]]]:
    """{trial_id: {gpu_index: [(ts, sm_util, mem_used_mib, temp_c), ...]}}"""
    out: dict[int, dict[int | None, list[tuple]]] = {}
    with engine.connect() as connection:
        for trial_id, gpu, ts, util, mem, temp in connection.execute(sqlalchemy.text(
                "SELECT trial_id, gpu_index, ts, sm_util, mem_used_mib, temp_c FROM hpo_telemetry "
                "ORDER BY trial_id, gpu_index, ts")):
            out.setdefault(trial_id, {}).setdefault(gpu, []).append((ts, util, mem, temp))
    return out


def _study(path: Path, trials: list[tuple[str, float, tuple[int | None, ...]]]) -> tuple[
        sqlalchemy.Engine, int, list[int]]:
    """A study whose trials (host, ended this many s ago, GPUs) each have SAMPLES samples per
    GPU: sm_util 0..9, mem_used_mib 100 + i, temp_c 50 - i (peaks and means tell apart)."""
    url = f"sqlite:///{path}"
    study = optuna.create_study(study_name="s", storage=url)
    engine = sqlalchemy.create_engine(url)
    tables.ensure_tables(engine)
    now, ids = time.time(), [study.ask()._trial_id for _ in trials]
    with engine.begin() as connection:  # after the asks: sqlite's one writer
        for number, ((host, ago, gpus), trial_id) in enumerate(zip(trials, ids, strict=True)):
            tables.insert_summary(connection, {
                "trial_id": trial_id, "study_id": study._study_id, "number": number,
                "state": "COMPLETE", "host": host, "gpu_index": gpus[0],
                "start_s": now - ago - 100, "end_s": now - ago})
            start = datetime.utcnow() - timedelta(seconds=ago + 100)
            tables.insert_samples(connection, [
                {"trial_id": trial_id, "ts": start + timedelta(seconds=i), "gpu_index": gpu,
                 "sm_util": float(i), "mem_used_mib": 100.0 + i, "temp_c": 50.0 - i,
                 "phase": "train"}
                for gpu in gpus for i in range(SAMPLES)])
    return engine, study._study_id, ids


def _passes(retention: TelemetryRetention, count: int) -> list[int]:
    """Trials downsampled by each of ``count`` forced passes."""
    done = []
    for _ in range(count):
        before = retention.downsampled
        retention.maybe_run(force=True)
        done.append(retention.downsampled - before)
    return done


def test_every_old_trial_is_downsampled_once_over_several_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention_module, "_BATCH", 3)
    old = [("h1", 3600.0 - i, (0,)) for i in range(7)]  # ended in this order, oldest first
    trials = [*old, ("h2", 3000.0, (0,)), ("h1", 1.0, (0,))]  # another host's; a recent one
    engine, study_id, ids = _study(tmp_path / "r.db", trials)
    retention = TelemetryRetention(engine, study_id, "h1", keep_full_s=KEEP_S, max_rows=2)
    assert _passes(retention, 4) == [3, 3, 1, 0]  # the cursor moves on: each old trial once, then nothing
    rows = _rows(engine)
    assert all(len(rows[t][0]) == 2 for t in ids[:7])
    assert len(rows[ids[7]][0]) == SAMPLES  # another host's trial: its orchestrator's
    assert len(rows[ids[8]][0]) == SAMPLES  # ended 1 s ago: full resolution for now
    retention.maybe_run()  # not forced, too soon after the last pass: nothing
    assert retention.downsampled == 7
    later = time.time() + KEEP_S + 5  # the recent trial is old enough now: found past the cursor
    monkeypatch.setattr(retention_module.time, "time", lambda: later)
    retention.maybe_run(force=True)
    assert retention.downsampled == 8 and len(_rows(engine)[ids[8]][0]) == 2


def test_trials_that_ended_at_the_same_time_across_a_batch_boundary_are_all_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention_module, "_BATCH", 2)
    engine, study_id, ids = _study(tmp_path / "r.db", [("h1", 3600.0, (0,))] * 5)
    with engine.begin() as connection:  # one end time for all: a batch ends among equals
        connection.execute(sqlalchemy.text("UPDATE hpo_trial_summary SET end_s = 1000.0"))
    retention = TelemetryRetention(engine, study_id, "h1", keep_full_s=KEEP_S, max_rows=2)
    assert _passes(retention, 4) == [2, 2, 1, 0]
    assert all(len(_rows(engine)[t][0]) == 2 for t in ids)


def test_each_gpu_is_bucketed_alone_with_means_and_peaks(tmp_path: Path) -> None:
    engine, study_id, ids = _study(tmp_path / "r.db", [("h1", 3600.0, (0, 1))])
    retention = TelemetryRetention(engine, study_id, "h1", keep_full_s=KEEP_S, max_rows=2)
    first = _rows(engine)[ids[0]]
    retention.maybe_run(force=True)
    rows = _rows(engine)[ids[0]]
    assert sorted(rows) == [0, 1]
    for gpu in (0, 1):
        # two buckets of five: sm_util's mean, memory's peak, temperature's peak, first ts
        assert [r[1:] for r in rows[gpu]] == [(2.0, 104.0, 50.0), (7.0, 109.0, 45.0)]
        assert [r[0] for r in rows[gpu]] == [first[gpu][0][0], first[gpu][5][0]]
