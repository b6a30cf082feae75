"""Issue 28 item 3: a password in a storage URL's query (``?password=``, ``sslpassword``,
``passfile``) is masked wherever ``user:pw@`` is: the run header, the ``next:`` line, errors,
``--show-config`` and the study attr hpo.config. (A real PostgreSQL with password
authentication: tests/e2e/test_postgres.py runs against whatever server CI gives it.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpo_orchestrator.cli import _first_hour as _cli_trials
from hpo_orchestrator.config import load_config
from hpo_orchestrator.db.connect import mask_url, mask_url_in, paste_url
from hpo_orchestrator.errors import HpoError, mask_passwords, url_passwords
from hpo_orchestrator.study import record_config

QUERY_URLS = [
    "postgresql+psycopg://me@db/hpo?password=s3cret",
    "postgresql+psycopg://me@db/hpo?sslmode=require&password=s3cret",
    "postgresql+psycopg://me@db/hpo?sslpassword=s3cret&sslmode=require",
    "postgresql+psycopg://me@db/hpo?passfile=/home/me/s3cret",
    "postgresql+psycopg://me:s3cret@db/hpo?PASSWORD=s3cret",
]


@pytest.mark.parametrize("url", QUERY_URLS)
def test_query_secrets_are_masked_in_every_form(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["hpo-orchestrator"])
    monkeypatch.delenv("MAKELEVEL", raising=False)
    assert "s3cret" not in mask_url(url) and "***" in mask_url(url)
    assert "s3cret" not in mask_passwords(f"cannot open {url}: refused")
    assert "s3cret" not in HpoError(f"storage {url!r} is down", f"check {url}").hint  # type: ignore[operator]
    key, value = re.search(r"(password|passfile)=([^&]+)", url, re.IGNORECASE).groups()  # type: ignore[union-attr]
    # where a driver quotes it: libpq's conninfo, and its warning naming the password file
    assert "s3cret" not in mask_url_in(f"driver said: host=db {key.lower()}={value} user=me", url)
    assert "s3cret" not in mask_url_in(
        f'WARNING: password file "{value}" has group or world access', url)
    secrets = url_passwords([f"storage.url={url}"])  # masked in --debug's Hydra tracebacks
    assert secrets and all("s3cret" in secret for secret in secrets)
    assert "s3cret" not in _cli_trials.next_steps(url, "sqlite:///hpo.db", 4)


def test_next_line_pastes_without_the_secret_and_says_where_it_comes_from() -> None:
    """libpq's drivers read a password left out of the URL from PGPASSWORD / ~/.pgpass: the
    pasted command connects (checked by hand against a scram-sha-256 PostgreSQL 15)."""
    shown, note = paste_url("postgresql+psycopg://me:pw@db:5433/hpo?sslmode=require&password=q")
    assert shown == "postgresql+psycopg://me@db:5433/hpo?sslmode=require"
    assert note is not None and "PGPASSWORD" in note and "~/.pgpass" in note
    assert paste_url("sqlite:///other.db") == ("sqlite:///other.db", None)
    shown, note = paste_url("mysql://me:pw@db/hpo")
    assert shown == "mysql://me:***@db/hpo" and note is not None


def test_show_config_masks_a_query_password(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "--show-config",
                 'storage.url="postgresql+psycopg://me@db/hpo?sslmode=require&password=s3cret"')
    assert result.code == 0, result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    assert "password=***" in result.stdout


def test_a_refused_url_with_a_query_password_is_masked(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--debug", "run",
                 'storage.url="postgresql+psycopg://u@127.0.0.1:1/db?password=s3cret"')
    assert result.code == 2, result.stderr
    assert "s3cret" not in result.stdout + result.stderr


def test_hpo_config_attr_never_holds_a_query_password() -> None:
    config = load_config(['storage.url="postgresql+psycopg://me@db/hpo?passfile=/s3cret&password=s3cret"'])
    stored: dict[str, Any] = {}
    record_config(SimpleNamespace(set_user_attr=stored.__setitem__), config)  # type: ignore[arg-type]
    assert "s3cret" not in str(stored["hpo.config"])
    assert stored["hpo.config"]["storage"]["url"].startswith("postgresql+psycopg://me@db/hpo?")


@pytest.mark.parametrize("text", [
    "connect failed: DATABASE_URL=postgresql://me:s3cret@db/hpo",
    "x_postgresql+psycopg://me:s3cret@db/hpo",
    "E" * 50_000 + " postgresql://me:s3cret@db/hpo " + "ab12" * 10_000,
])
def test_a_password_in_a_long_or_glued_message_is_masked(text: str) -> None:
    """The pattern's parts are bounded and a scheme starts a word (a trial's 30,000-character
    message took seconds to mask); a URL glued to a name by '_' or '=' is still found."""
    from hpo_orchestrator.errors import mask_passwords

    masked = mask_passwords(text)
    assert "s3cret" not in masked and "me:***@db/hpo" in masked


def test_a_password_of_one_letter_is_masked_only_where_it_is_the_password(cli) -> None:  # type: ignore[no-untyped-def]
    """By its place in the URL, never by its text: the password ``p`` masked every p of the
    message and hint ('***ostgres://u:***@localhost/h***o')."""
    url = "postgres://u:p@localhost/hpo"
    assert mask_passwords(f"storage.url: {url!r}; hint postgresql+psycopg://u@host/hpo",
                          url_passwords([f"storage.url={url}"])) == (
        "storage.url: 'postgres://u:***@localhost/hpo'; hint postgresql+psycopg://u@host/hpo")
    spaced = 'storage.url="postgresql+psycopg://me:p p@db/hpo"'  # a word split cuts it
    assert mask_passwords("bad value postgresql+psycopg://me:p p@db/hpo (p)",
                          url_passwords([spaced])) == "bad value postgresql+psycopg://me:***@db/hpo (p)"
    result = cli("run", f"storage.url={url}")
    assert result.code == 2
    assert result.stderr.splitlines()[0] == (
        "error: storage URL 'postgres://u:***@localhost/hpo': SQLAlchemy has no dialect or "
        "driver 'postgres'")
    assert "postgresql+psycopg://user@host/db" in result.stderr  # the hint, whole


@pytest.mark.slow
@pytest.mark.postgres
def test_a_url_from_the_environment_is_on_no_command_line_of_the_run(
        tmp_path: Path, postgres_url: str) -> None:
    """storage.url='${oc.env:VAR}' (docs/CONFIGURATION.md, "Passwords"): neither the
    orchestrator's command line nor its workers' hold the password, which ps shows any user."""
    import time

    import psutil
    import sqlalchemy

    from tests.conftest import start_cli

    secret = "s3cretword"  # PostgreSQL's trust authentication takes any password
    with_password = sqlalchemy.engine.make_url(postgres_url).set(password=secret)
    url = with_password.render_as_string(hide_password=False)
    study = f"env-{time.time_ns()}"
    run = start_cli(tmp_path, "run", "objective=custom", "objective.target=tests.objectives:sleepy",
                    "storage.url=${oc.env:HPO_TEST_DB}", f"study.name={study}",
                    "study.n_trials=1", "scheduler.gpus=none",
                    env={"HPO_TEST_DB": url, "HPO_TEST_SLEEP_S": "30"})
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None and len(seen) < 2:
            tree = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
            seen = [" ".join(p.cmdline()) for p in tree if p.is_running()]
            time.sleep(0.2)
        assert len(seen) >= 2, seen  # the orchestrator and a worker
        assert not [line for line in seen if secret in line], seen
        assert any("${oc.env:HPO_TEST_DB}" in line for line in seen)
    finally:
        run.kill()
        run.communicate()
