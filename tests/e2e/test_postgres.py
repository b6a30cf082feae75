"""The same run, status, report and tune-pruner against a real PostgreSQL server.

Set HPO_TEST_POSTGRES_URL (``.ci/run`` does, and also sets HPO_TEST_REQUIRE_POSTGRES=1 so an
unreachable server fails CI instead of skipping).
"""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.mark.long
def test_run_and_status_on_postgres(cli, postgres_url: str) -> None:  # type: ignore[no-untyped-def]
    study = f"pg-{uuid.uuid4().hex[:8]}"
    result = cli("run", "objective=custom",
                 "objective.target=tests.objectives:curves",
                 "objective.setup=tests.objectives:slow_setup",
                 "scheduler.worker_mode=fresh", "pruner=median", "pruner.n_startup_trials=2",
                 "scheduler.parallel=2", "study.n_trials=6", f"study.name={study}",
                 f"storage.url={postgres_url}")
    assert result.code == 0, result.stderr
    status = cli("status", "--storage", postgres_url, "--study", study, "--json")
    assert status.code == 0, status.stderr
    report = json.loads(status.stdout)
    finished = sum(report["states"][s]["count"] for s in ("COMPLETE", "PRUNED", "FAIL"))
    assert finished == 6 and report["states"]["RUNNING"]["count"] == 0
    assert report["per_device"][0]["device"] == "cpu"
    # startup (a fresh interpreter and a 1.5 s setup) dwarfs the 0.02 s to the first pruning
    # decision: the slow_startup finding must come out of PostgreSQL's rows, over all 6 trials
    codes = {f["code"]: f for f in report["findings"]}
    assert codes["slow_startup"]["evidence"]["trials"] == 6
    assert not set(codes) & {"stale_running", "idle_gpu", "low_gpu_util", "gpu_unused"}
    assert report["states"]["COMPLETE"]["mean_s"] > 0


@pytest.mark.parametrize("in_query", [False, True], ids=["user-pw", "query"])
def test_password_never_stored_or_printed(cli, postgres_url: str, in_query: bool) -> None:  # type: ignore[no-untyped-def]
    url = sqlalchemy.engine.make_url(postgres_url)
    url = url.update_query_dict({"password": "s3cret-pw"}) if in_query else url.set(password="s3cret-pw")
    rendered = url.render_as_string(hide_password=False)
    study = f"pg-{uuid.uuid4().hex[:8]}"
    result = cli("run", "objective=custom",
                 "objective.target=tests.objectives:quadratic",
                 "study.n_trials=1", f"study.name={study}",
                 # a query's '=' must be quoted for Hydra, as a user types it
                 f"storage.url='{rendered}'" if in_query else f"storage.url={rendered}")
    assert result.code == 0, result.stderr  # trust auth ignores the password
    assert "s3cret-pw" not in result.stdout + result.stderr
    with sqlalchemy.create_engine(postgres_url).connect() as con:
        stored = con.execute(sqlalchemy.text(
            "SELECT a.value_json FROM study_user_attributes a JOIN studies s USING (study_id) "
            "WHERE s.study_name = :n AND a.key = 'hpo.config'"), {"n": study}).scalar()
    assert stored and "s3cret-pw" not in stored and "***" in json.loads(stored)["storage"]["url"]


def test_report_and_tune_pruner_on_postgres(cli, postgres_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    study = f"pg-{uuid.uuid4().hex[:8]}"
    result = cli("run", "objective=custom",
                 "objective.target=tests.objectives:curves",
                 "pruner.min_resource=auto", "scheduler.parallel=2", "study.n_trials=6",
                 f"study.name={study}", f"storage.url={postgres_url}", "telemetry.interval_s=0.05")
    assert result.code == 0, result.stderr
    html = tmp_path / "r.html"
    report = cli("report", "--storage", postgres_url, "--study", study, "--out", str(html))
    assert report.code == 0, report.stderr
    assert "6 trials" in report.stdout and html.stat().st_size > 1_000_000
    tuned = cli("tune-pruner", "--storage", postgres_url, "--study", study, "--json",
                "--patience", "0,3", "--min-resource", "1", "--reduction-factor", "3")
    assert tuned.code == 0, tuned.stderr
    data = json.loads(tuned.stdout)
    assert data["results"] and data["recommendation"]["reason"]
    # the per-trial timings came through PostgreSQL's JSON attrs: a cost model, not zeros
    assert any(r["gpu_s"] > 0 for r in data["results"])
