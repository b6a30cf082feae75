"""idle_gpu says only what is true (issue 43, item 2): a GPU is idle when it had no trial while
the study's runs were running and trials waited, not because of the gap between two runs,
the few tenths of a second between tiny trials, another study's trials on it, or a window too
short to prove anything; and the finding quotes the per-device table's busy figure.

Each study here is written by hand into sqlite (trials with their hpo.host / hpo.gpu_index
attrs and their start and end), status reads it both from a fresh fold and from the kept
tally, and the expected numbers are worked out in the comments.
"""

from __future__ import annotations

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
from hpo_orchestrator.status._model import StatusReport
from hpo_orchestrator.tally._tally import advance

HOST = "h"
T0 = datetime(2026, 1, 1, 12, 0, 0)
GPUS = [{"index": 0, "uuid": "GPU-0", "name": "fake"}, {"index": 1, "uuid": "GPU-1", "name": "fake"}]

# (gpu index, start s, end s, state, extra attrs), seconds from T0
Trial = tuple[int, float, float, TrialState, dict[str, Any]]


def _write(url: str, name: str, trials: list[Trial], gpus: int = 1) -> None:
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name=name)
    study.set_user_attr("hpo.config", {"scheduler": {"parallel": None}})
    study.set_user_attr(f"hpo.devices.{HOST}", GPUS[:gpus])
    for gpu, start, end, state, extra in trials:
        study.add_trial(create_trial(
            state=state, value=0.5 if state == TrialState.COMPLETE else None,
            params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
            user_attrs={"hpo.host": HOST, "hpo.gpu_index": gpu, **extra}))
        with storage.engine.begin() as connection:
            connection.execute(sqlalchemy.text(
                "UPDATE trials SET datetime_start = :a, datetime_complete = :b WHERE trial_id = :t"),
                {"a": T0 + timedelta(seconds=start), "b": T0 + timedelta(seconds=end),
                 "t": study.trials[-1]._trial_id})
    storage.engine.dispose()


def _kept(url: str, *names: str) -> None:
    """Fold every study into its kept tally, as a run's start does (summary rows included)."""
    engine = connect.create_engine(url, read_only=False)
    tables.ensure_tables(engine)
    with engine.begin() as connection:
        for name in names:
            advance(connection, db.study_id_of(connection, name)[0], name, rebuild=True)
    engine.dispose()


def _status(url: str, name: str) -> StatusReport:
    engine = connect.create_engine(url)
    try:
        return collect_status(engine, name)
    finally:
        engine.dispose()


def _both(url: str, name: str, *others: str) -> list[StatusReport]:
    """The report from a fresh fold of every trial, then from the kept tally. ``others``:
    studies whose trials ended in runs of theirs (summary rows written, as a run does)."""
    _kept(url, *others)
    fresh = _status(url, name)
    _kept(url, name)
    return [fresh, _status(url, name)]


def _busy(report: StatusReport) -> dict[str, float | None]:
    return {d.device: None if d.busy_fraction is None else round(d.busy_fraction, 3)
            for d in report.per_device}


def _idle(report: StatusReport) -> list[Any]:
    return [f for f in report.findings if f.code == "idle_gpu"]


def _back_to_back(gpu: int, start: float, n: int, length: float, gap: float = 0.0) -> list[Trial]:
    return [(gpu, start + i * (length + gap), start + i * (length + gap) + length,
             TrialState.COMPLETE, {}) for i in range(n)]


def test_a_second_run_on_the_study_leaves_the_gap_between_runs_out(tmp_path: Path) -> None:
    """(a) study.add_trials=3 an hour later: 5 trials of 100 s, then 3 more from 3600 s. The
    GPU had a trial whenever a run ran: busy 800 s of 800 s with trials running (the span from
    the first start, 3900 s, would read 21 %)."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _write(url, "a", _back_to_back(0, 0, 5, 100) + _back_to_back(0, 3600, 3, 100))
    for report in _both(url, "a"):
        assert report.wall_s == pytest.approx(3900)
        assert report.active_s == pytest.approx(800)
        assert _busy(report) == {"gpu0": 1.0}
        assert _idle(report) == []


def test_a_ctrl_c_and_resume_leaves_the_pause_out(tmp_path: Path) -> None:
    """(b) Ctrl-C at 250 s (trial #2 interrupted, re-run later), resumed at 1000 s on both GPUs.
    Run 1: gpu0 0-100, 100-200, 200-250 (interrupted); gpu1 0-120, 120-250 (interrupted).
    Run 2: gpu0 1000-1100, 1100-1200; gpu1 1000-1190. Time with trials running: 250 + 200 = 450 s;
    gpu0 busy 450 s (100 %), gpu1 250 + 190 = 440 s (98 %)."""
    stopped = {"hpo.fail_reason": "interrupted", "hpo.retried": True, "hpo.pid": 1,
               "hpo.error": "stopped by SIGINT"}
    trials = [(0, 0, 100, TrialState.COMPLETE, {}), (1, 0, 120, TrialState.COMPLETE, {}),
              (0, 100, 200, TrialState.COMPLETE, {}), (1, 120, 250, TrialState.FAIL, stopped),
              (0, 200, 250, TrialState.FAIL, stopped),
              (0, 1000, 1100, TrialState.COMPLETE, {}), (1, 1000, 1190, TrialState.COMPLETE, {}),
              (0, 1100, 1200, TrialState.COMPLETE, {})]
    url = f"sqlite:///{tmp_path / 'b.db'}"
    _write(url, "b", trials, gpus=2)
    for report in _both(url, "b"):
        assert report.active_s == pytest.approx(450)
        assert _busy(report) == {"gpu0": 1.0, "gpu1": round(440 / 450, 3)}
        assert _idle(report) == []


def test_tiny_trials_do_not_blame_the_gpu(tmp_path: Path) -> None:
    """(c) 0.1 s trials, 0.3 s apart on each of two GPUs (gpu1 0.2 s behind gpu0), 100 each:
    the study has a trial running 0.2 s of every 0.4 s (20 s), each GPU half of it, empty 10 s,
    but what it waits for between trials (0.1 s a trial) is the orchestrator's latency, not
    work it could have had."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _write(url, "c", _back_to_back(0, 0, 100, 0.1, gap=0.3)
           + _back_to_back(1, 0.2, 100, 0.1, gap=0.3), gpus=2)
    for report in _both(url, "c"):
        assert report.active_s == pytest.approx(20, abs=0.01)
        assert _busy(report) == {"gpu0": 0.5, "gpu1": 0.5}
        assert _idle(report) == []


def test_another_studys_trials_keep_the_gpu_busy(tmp_path: Path) -> None:
    """(d) Study A holds gpu0 from 0 to 1000 s with 10 trials of 100 s; study B, beside it,
    runs 5 trials of 200 s on gpu1. B's table shows gpu0 0 % (none of B's trials), yet the GPU
    was never idle: no finding."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    _write(url, "A", _back_to_back(0, 0, 10, 100), gpus=2)
    _write(url, "B", _back_to_back(1, 0, 5, 200), gpus=2)
    for report in _both(url, "B", "A"):
        assert _busy(report) == {"gpu0": 0.0, "gpu1": 1.0}
        assert _idle(report) == []


def test_a_gpu_partly_busy_with_another_study_says_so(tmp_path: Path) -> None:
    """Study A has gpu0 from 0 to 300 s (3 trials of 100 s); study B runs 5 trials of 200 s on
    gpu1 and none on gpu0. Up to B's last start (800 s), gpu0 had A's trials 300 s of 800
    (38 %) and none of B's: 500 s empty, idle. The finding gives the table's 0 % and A's share."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _write(url, "A", _back_to_back(0, 0, 3, 100), gpus=2)
    _write(url, "B", _back_to_back(1, 0, 5, 200), gpus=2)
    for report in _both(url, "B", "A"):
        assert _busy(report) == {"gpu0": 0.0, "gpu1": 1.0}
        [idle] = _idle(report)
        assert idle.evidence["devices"][0]["other_studies_fraction"] == 0.375
        assert idle.message == ("gpu0 was busy 0% of the 1000 s with trials running (0% while "
                                "trials waited to start, other studies' trials 38%; 0 trials ran "
                                "on it)")


def test_an_idle_gpu_is_still_found_and_quoted_as_the_table_says(tmp_path: Path) -> None:
    """The finding still speaks where a GPU really idled: 10 trials of 100 s one after another
    on gpu0 (scheduler.parallel=1 on a 2-GPU host), none on gpu1: gpu1 busy 0 % of 1000 s."""
    url = f"sqlite:///{tmp_path / 'i.db'}"
    _write(url, "i", _back_to_back(0, 0, 10, 100), gpus=2)
    for report in _both(url, "i"):
        assert _busy(report) == {"gpu0": 1.0, "gpu1": 0.0}
        [idle] = _idle(report)
        assert idle.evidence["devices"] == [{"device": "gpu1", "busy_fraction": 0.0,
                                             "busy_fraction_queued": 0.0, "active_s": 1000.0,
                                             "trials": 0}]
        assert idle.message == ("gpu1 was busy 0% of the 1000 s with trials running (0% while "
                                "trials waited to start; 0 trials ran on it)")


def test_two_trials_at_once_are_not_idle(tmp_path: Path) -> None:
    """(e) Two trials, one per GPU, started 0.05 s apart: gpu0 0-100 s, gpu1 0.05-98 s. The
    time while a trial still waited to start is 0.05 s: too short to call anything idle."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _write(url, "e", [(0, 0, 100, TrialState.COMPLETE, {}), (1, 0.05, 98, TrialState.COMPLETE, {})],
           gpus=2)
    for report in _both(url, "e"):
        assert _busy(report) == {"gpu0": 1.0, "gpu1": round(97.95 / 100, 3)}
        assert _idle(report) == []
