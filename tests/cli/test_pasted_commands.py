"""What the CLI prints for the user to paste runs as typed: tune-pruner's command (its
study name and artifact folder), status --trial's logs command, the note on a password left
out; and a storage password holding an '@' is refused whatever follows it (a review of the
walkthrough's fixes)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.cli import main
from hpo_orchestrator.config import load_config
from hpo_orchestrator.config._load import to_plain_dict
from hpo_orchestrator.errors import StorageError
from hpo_orchestrator.pruning._command import recommended_command
from hpo_orchestrator.scheduler._logs import run_dir

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used",
                                        "ignore::optuna.exceptions.ExperimentalWarning")

PRUNER = "pruner=median pruner.n_warmup_steps=3"


# --- 2. check_url: an '@' in the password that is followed by '/', '?' or ':' -------------

@pytest.mark.parametrize("tail", ["tpw/x", "tpw?x", "tpw:9"])
def test_an_at_sign_in_the_password_is_refused_whatever_follows_it(tail: str) -> None:
    """'u:Secr@<tail>@127.0.0.1/test': SQLAlchemy ends the password at the first '@'; with a
    '/' or '?' after it, the password's tail is the host ('failed to resolve host 'tpw''
    printed back); with ':9', 'the port is not a number'. Only 'u:p@ss@host' was caught."""
    from hpo_orchestrator.db.connect import check_url

    with pytest.raises(StorageError, match="password holds an '@'"):
        check_url(f"postgresql+psycopg://u:Secr@{tail}@127.0.0.1:5432/test")


# --- 3. tune-pruner's command: the replayed study's own artifact folder -------------------

@pytest.mark.parametrize("name", ["exp 1", "Σx"])
def test_the_default_store_of_a_study_with_a_rewritten_folder_name_is_not_copied(name: str) -> None:
    """The default store is run_dir(...)/artifacts, whose folder is not the study's name where
    that is no safe folder name ('exp_1-<hash>'): it was copied, and the new study wrote into
    the old one's folder. (tune-pruner passes the folder: test_tune_pruner_prints_that_command.)"""
    recorded = to_plain_dict(load_config([f"study.name='{name}'"]))
    folder = run_dir("sqlite:///hpo.db", name)
    recorded["artifacts"]["store"] = str(folder / "artifacts")
    command = recommended_command("hpo-orchestrator", name, recorded, PRUNER, set(),
                                  folder=folder.name)
    assert "artifacts.store" not in command, command


@pytest.mark.parametrize("name", ["it's", "a,b", "x[1]", "é"])
def test_the_new_study_name_is_given_as_hydra_reads_it(name: str) -> None:
    """(Older than 7f0a7d3.) study.name=<name>-median is shell-quoted but not Hydra-quoted:
    quotes, commas, brackets and non-ASCII letters do not load."""
    recorded = to_plain_dict(load_config([]))
    command = recommended_command("hpo-orchestrator", name, recorded, PRUNER, set())
    assert load_config(shlex.split(command)[2:]).study.name == f"{name}-median"


# --- 4. 'status --trial N': the log line's logs command -----------------------------------

def _study_with_a_logged_trial(url: str, name: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=url, study_name=name)
    trial = study.ask()
    trial.set_user_attr("hpo.log_path", "/tmp/trial-0.log")
    study.tell(trial, 1.0)


def _logs_command(out: str) -> list[str]:
    line = " ".join(out.split())
    found = re.search(r"log: /tmp/trial-0\.log \((.*)\)$", line)
    assert found, out
    return shlex.split(found.group(1))  # ValueError: No closing quotation


def test_status_trial_quotes_a_logs_command_that_pastes(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """as_typed(...).strip("'") strips the closing quote of a quoted last argument: a study
    named 'exp 1' or a storage path with a space gave "--storage 'sqlite:///.../my dir/hpo.db"."""
    folder = tmp_path / "my dir"
    folder.mkdir()
    url = f"sqlite:///{folder / 'hpo.db'}"
    _study_with_a_logged_trial(url, "exp 1")
    assert main(["status", "--trial", "0", "--study", "exp 1", "--storage", url]) == 0
    words = _logs_command(capsys.readouterr().out)
    assert words[-4:] == ["--study", "exp 1", "--storage", url]


# --- 4. the quoted commands lose the password, and say nothing of it -----------------------

@pytest.mark.postgres
def test_status_says_where_the_password_of_a_quoted_command_comes_from(
        postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`status --trial 0 --storage postgresql+psycopg://u:pw@...` quotes 'logs 0 --storage
    postgresql+psycopg://u@...': pasted without PGPASSWORD it cannot log in, and unlike
    'next:' and tune-pruner's 'run with:', nothing says so (paste_url's note is dropped)."""
    import sqlalchemy

    from tests.scheduler.test_reliability_storage import _fresh_postgres

    with _fresh_postgres(postgres_url) as fresh:
        with_password = sqlalchemy.engine.make_url(fresh).set(password="s3cret") \
            .render_as_string(hide_password=False)
        _study_with_a_logged_trial(with_password, "lgb")
        assert main(["status", "--trial", "0", "--storage", with_password]) == 0
        out = capsys.readouterr().out
        words = _logs_command(out)
        assert "s3cret" not in out and words[words.index("--storage") + 1].count(":") == 2
        assert "PGPASSWORD" in out, out
