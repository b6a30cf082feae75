"""The report: its data from a real orchestrated study (fake GPUs), the HTML and PNG files,
bad input, and the page drawn by headless Chromium."""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo_orchestrator.db.connect import create_engine
from hpo_orchestrator.report import CHART_IDS, collect_report
from tests.conftest import RunResult, run_cli

TARGET = "objective.target=tests.objectives:curves"
FAKE_GPUS = {"gpus": [{"busy_util": 37}, {"busy_util": 53}]}
SM_UTIL = {"gpu0": 37.0, "gpu1": 53.0}


def _plotly_traces(page: str) -> dict[str, list[dict[str, Any]]]:
    """chart id -> the traces plotly was given (the JSON of each Plotly.newPlot call)."""
    charts = {}
    for call in re.finditer(r'Plotly\.newPlot\(\s*"([\w-]+)-plot",\s*', page):
        charts[call.group(1)], _ = json.JSONDecoder().raw_decode(page, call.end())
    return charts


def _trial_values(db: Path) -> list[tuple[int, float]]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT t.number, v.value FROM trials t JOIN trial_values v "
                           "USING (trial_id) WHERE t.state = 'COMPLETE' ORDER BY t.number").fetchall()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """16 trials on 2 fake GPUs, half of them pruned by the median rule, sampled at 20 Hz.

    The GPUs read 37 % and 53 % while a trial runs: SM readings no CPU % would match."""
    work = tmp_path_factory.mktemp("report")
    # parallel=auto on GPUs: stored as the text "auto" (status and report compared it with a number)
    result = run_cli(work, "run", "objective=custom", TARGET, "scheduler.parallel=auto",
                     "study.n_trials=16", "pruner=median", "pruner.n_startup_trials=2",
                     "pruner.n_warmup_steps=1", "telemetry.interval_s=0.05", "sampler=random",
                     "sampler.seed=1", env={"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps(FAKE_GPUS),
                                            # steps of 0.05 s: a study of a few seconds, long
                                            # enough for the utilization chart to have lines
                                            # (at 0.02 s it lasted 1 s and was drawn blank)
                                            "HPO_TEST_STEP_S": "0.05"})
    assert result.code == 0, result.stderr
    return result


@pytest.mark.slow
def test_report_data_follows_the_study(study: RunResult) -> None:
    data = collect_report(create_engine(f"sqlite:///{study.db}"), None)
    assert len(data.bars) == 16
    assert {lane.split(" #")[0] for lane in data.lanes} == {"gpu0", "gpu1"}
    for lane in data.lanes:  # trials on one lane never overlap: a lane is one slot's timeline
        bars = sorted((b for b in data.bars if b.lane == lane), key=lambda b: b.start)
        assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(bars))
    states = {b.state for b in data.bars}
    assert states == {"COMPLETE", "PRUNED"}
    pruned = [b for b in data.bars if b.state == "PRUNED"]
    assert sum(data.prune_steps.values()) == len(pruned)
    assert data.utilization_kind == "gpu"
    assert {s.device for s in data.utilization} <= {"gpu0", "gpu1"} and data.utilization
    assert all(0 <= u <= 100 for s in data.utilization for u in s.util)
    completed = sorted(b.number for b in data.bars if b.state == "COMPLETE")
    assert [n for n, _ in data.history] == completed
    best = [v for _, v in data.best_so_far]
    assert best == sorted(best, reverse=True)  # minimize: the best so far never gets worse
    assert best[-1] == min(v for _, v in data.history)


@pytest.mark.slow
def test_report_last_draws_the_newest_trials_and_sums_up_all(study: RunResult, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    from hpo_orchestrator.report import render_png

    data = collect_report(create_engine(f"sqlite:///{study.db}"), None, last=5)
    assert sorted(b.number for b in data.bars) == list(range(11, 16)) and data.first_number == 11
    assert sum(s.count for s in data.status.states.values()) == 16  # the summary: every trial
    assert data.history and all(n >= 11 for n, _ in data.history)
    assert all(b.start >= 0 for b in data.bars)  # the time axis starts at the first one drawn
    titles: list[str] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: titles.append(self.get_suptitle()))
    render_png(data, tmp_path / "r.png")
    assert titles == [f"Study {data.study} (trials #11 on: the newest 5)"]
    html = tmp_path / "r.html"
    result = run_cli(study.db.parent, "report", "--last", "5", "--out", str(html))
    assert result.code == 0, result.stderr
    assert "5 trials on" in result.stdout and "from trial #11 on (--last)" in html.read_text()
    everything = run_cli(study.db.parent, "report", "--last", "0", "--out", str(html))
    assert "16 trials on" in everything.stdout and "(--last)" not in html.read_text()


@pytest.mark.slow
def test_report_cli_writes_html_and_png(study: RunResult, tmp_path: Path) -> None:
    html, png = tmp_path / "r.html", tmp_path / "r.png"
    result = run_cli(study.db.parent, "report", "--out", str(html), "--png", str(png))
    assert result.code == 0, result.stderr
    page = html.read_text()
    for chart_id in CHART_IDS:
        assert f'id="{chart_id}"' in page
    assert len(page) > 1_000_000  # plotly.js is inlined: the page opens on an offline node
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left

    # What the charts were given, read back from the page: the GPUs' SM %, and the values
    charts = _plotly_traces(page)
    assert set(charts) == set(CHART_IDS)
    utilization = {t["name"]: t["y"] for t in charts["utilization"]}
    assert set(utilization) == set(SM_UTIL)
    for device, util in utilization.items():
        assert util and set(util) == {SM_UTIL[device]}, (device, util)
    points = {t["name"]: list(zip(t["x"], t["y"], strict=True)) for t in charts["history"]}
    values = _trial_values(study.db)
    assert len(values) >= 3 and [tuple(p) for p in points["objective value"]] == values


@pytest.mark.slow
def test_png_draws_the_same_data(study: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PNG's axes hold the SM % and the objective values (the figure, caught as it is saved)."""
    from matplotlib.figure import Figure

    from hpo_orchestrator.report import render_png

    saved: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (saved.append(self), save(self, *a, **k)))
    render_png(collect_report(create_engine(f"sqlite:///{study.db}"), None), tmp_path / "r.png")
    _timeline, utilization, _prune, history = saved[0].axes
    lines = {line.get_label(): list(line.get_ydata()) for line in utilization.get_lines()}
    assert set(lines) == set(SM_UTIL)
    for device, util in lines.items():
        assert util and set(util) == {SM_UTIL[device]}, (device, util)
    [scatter] = history.collections
    assert [tuple(p) for p in scatter.get_offsets().tolist()] == _trial_values(study.db)


@pytest.mark.parametrize(("args", "message"), [
    (["--out", "report.txt"], "expected a .html file name"),
    (["--png", "missing/r.png"], "does not exist"),
    ([], "nothing to write"),
    (["--out", "r.html", "--last", "-3"], "--last"),
])
def test_report_bad_input_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    # Optuna's tables and no study: the targets are checked before the storage is read
    optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'hpo.db'}").engine.dispose()
    result = run_cli(tmp_path, "report", *args)
    assert result.code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hpo.db"]


@pytest.mark.slow
@pytest.mark.browser
def test_report_charts_are_drawn_in_headless_chromium(study: RunResult, tmp_path: Path) -> None:
    from tests.browser import browser_unavailable, check_report

    reason = browser_unavailable()
    if reason:
        if os.environ.get("HPO_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    html = tmp_path / "r.html"
    assert run_cli(study.db.parent, "report", "--out", str(html)).code == 0
    checks = check_report(html, CHART_IDS, screenshot=tmp_path / "page.png")
    assert [c.chart_id for c in checks] == list(CHART_IDS)
    for check in checks:
        assert check.svg, f"{check.chart_id}: plotly drew no SVG"
        assert check.traces >= 1, f"{check.chart_id}: no trace drawn"
        assert check.colored_fraction > 0.001, f"{check.chart_id}: its plot area is blank"
    assert (tmp_path / "page.png").stat().st_size > 10_000


@pytest.mark.parametrize(("finished", "said"), [
    (3, "Where trials were pruned: none of the 3 finished trials was pruned."),
    (1, "Where trials were pruned: the one finished trial was not pruned."),
    (0, "Where trials were pruned: no trial has finished yet."),
])
def test_a_study_without_a_pruned_trial_says_so_instead_of_an_empty_chart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finished: int, said: str) -> None:
    from matplotlib.figure import Figure

    from hpo_orchestrator.report import render_html, render_png

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    made = optuna.create_study(storage=url, study_name="plain")
    for x in range(finished):
        made.tell(made.ask(), float(x))
    if not finished:
        made.ask()  # running: the study has a trial, none finished
    data = collect_report(create_engine(url), None)
    page = render_html(data)
    assert f'<div class="chart" id="prune-steps">{said}</div>' in page
    assert set(_plotly_traces(page)) == set(CHART_IDS) - {"prune-steps"}
    saved: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (saved.append(self), save(self, *a, **k)))
    render_png(data, tmp_path / "r.png")
    prune = saved[0].axes[2]
    assert not prune.axison and not prune.patches  # no frame, no bar
    assert [t.get_text() for t in prune.texts] == [said.split(": ", 1)[1]]
