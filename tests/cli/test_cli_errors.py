"""Bad input through the real command: exit 2, one `error:` line and a hint, nothing written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

CASES = [
    ["scheduler.parallel=four"],
    ["scheduler.nope=1"],
    ["pruner.patience=-2"],
    ["pruner.min_resource=9", "pruner.max_resource=3"],
    ["objective=nope"],
    ["objective=custom", "objective.target=no_such_module_xyz:objective"],
    ["objective=custom", "objective.target=tests.objectives:missing"],
    ["scheduler.gpus=[7]"],
    ["storage.url=sqlite:///no/such/folder/hpo.db"],
    ["storage.url=postgresql+psycopg://user:s3cret@127.0.0.1:1/db"],
    # Hydra cannot parse these unquoted; its message quotes the override whole (issue 15)
    ["storage.url=postgresql+psycopg://u:Xy,s3cret@host/db"],
    ["storage.url=postgresql+psycopg://u:Xy#s3cret@host/db"],
    ["storage.url=postgresql+psycopg://u:Xy's3cret@host/db"],
    # a dialect or driver that is not there, a port that is not a number (were exit 1)
    ["storage.url=postgresql+nodriver://u:s3cret@host/db"],
    ["storage.url=mysql://u:s3cret@127.0.0.1:1/db"],
    ["storage.url=postgresql+psycopg://u:s3cret@host:abc/db"],
    # an unescaped '@' in the password: SQLAlchemy took its tail for the host, which the
    # driver's "failed to resolve host" quoted back
    ["storage.url=postgresql+psycopg://u:p@ss3cret@127.0.0.1:1/db"],
    # longer than Optuna's studies.study_name (VARCHAR(512)): refused before the study exists
    ["study.name=" + "a" * 600],
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o)[:70])
def test_bad_input_exits_2_without_writing(cli, tmp_path: Path, overrides: list[str]) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", *overrides, env={"HPO_ORCHESTRATOR_FAKE_GPUS": "2"})
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ")
    assert all(line.startswith(("error: ", "hint: ")) for line in lines), result.stderr
    assert "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr + result.stdout
    assert not list(tmp_path.glob("*.db*"))


def test_not_an_optuna_database(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "hpo.db").write_text("this is not sqlite")
    result = cli("run", "study.n_trials=1")
    assert result.code == 2
    assert "not a sqlite database" in result.stderr
    assert (tmp_path / "hpo.db").read_text() == "this is not sqlite"


def test_debug_shows_traceback(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--debug", "run", "scheduler.parallel=four")
    assert result.code != 0 and "Traceback" in result.stderr


def test_debug_goes_anywhere_on_the_line(cli) -> None:  # type: ignore[no-untyped-def]
    """`status ... --debug` and `run ... --debug`, as people type it: a traceback, not
    'unrecognized arguments: --debug'."""
    for args in (["status", "--study", "nosuch", "--debug"], ["run", "scheduler.parallel=four", "--debug"]):
        result = cli(*args)
        assert result.code == 2 and "Traceback" in result.stderr, result.stderr
        assert "unrecognized" not in result.stderr and "--debug" not in result.stderr


def test_an_at_sign_in_the_password_is_named_not_leaked(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("status", "--storage", "postgresql+psycopg://u:p@ss3cret@127.0.0.1:1/db")
    assert result.code == 2 and "s3cret" not in result.stderr + result.stdout
    assert result.stderr.splitlines() == [
        "error: storage URL 'postgresql+psycopg://u:***@127.0.0.1:1/db': its password holds an '@'",
        "hint: write each '@' in the password as %40 (URL-encoded)"]


def test_debug_traceback_masks_the_password(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--debug", "run", "storage.url=postgresql+psycopg://u:Xy,s3cret@host/db")
    assert result.code == 2 and "Traceback" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout
    assert "u:***@host" in result.stderr


def test_quoted_url_with_a_comma_is_read_and_masked(cli) -> None:  # type: ignore[no-untyped-def]
    """The hint's way out works: a double-quoted value takes ',' and the password stays hidden
    (the README's storage.url example, as written there)."""
    bad = cli("run", "storage.url=postgresql+psycopg://me:a,b@db/hpo")
    assert "double quotes" in bad.stderr and ":a,b@" not in bad.stderr
    result = cli("run", "--show-config", 'storage.url="postgresql+psycopg://me:a,b@db/hpo"')
    assert result.code == 0, result.stderr
    assert "url: postgresql+psycopg://me:***@db/hpo" in result.stdout
    assert ":a,b@" not in result.stdout + result.stderr


def _conf_copy(tmp_path: Path) -> Path:
    conf = tmp_path / "myconf"
    shutil.copytree(REPO / "conf", conf)
    return conf


def test_malformed_yaml_in_the_config_folder(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conf = _conf_copy(tmp_path)
    (conf / "sampler" / "tpe.yaml").write_text("seed: [1, 2\n")
    result = cli("run", "sampler=tpe", env={"HPO_ORCHESTRATOR_CONF": str(conf)})
    assert result.code == 2, result.stderr
    assert result.stderr.startswith(f"error: {conf / 'sampler' / 'tpe.yaml'}, line 2: not valid YAML")
    assert "hint: " in result.stderr and "unexpected" not in result.stderr
    assert not list(tmp_path.glob("*.db*"))


def test_relative_conf_folder_is_read_from_the_current_folder(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _conf_copy(tmp_path)
    result = cli("run", "--show-config", env={"HPO_ORCHESTRATOR_CONF": "myconf"})
    assert result.code == 0, result.stderr
    missing = cli("run", "--show-config", env={"HPO_ORCHESTRATOR_CONF": "nope"})
    assert missing.code == 2
    assert missing.stderr.splitlines()[0] == f"error: no config.yaml in {tmp_path / 'nope'}"


def test_a_lease_folder_that_is_a_file_is_refused_before_the_study(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "leases").write_text("")
    result = cli("run", "scheduler.lease_dir=leases/here", "study.n_trials=1",
                 env={"HPO_ORCHESTRATOR_FAKE_GPUS": "1"})
    assert result.code == 2, result.stderr
    assert result.stderr.splitlines() == [
        "error: GPU lease folder leases/here: leases is not a folder",
        "hint: set scheduler.lease_dir (or $HPO_ORCHESTRATOR_LEASE_DIR) to a folder"]
    assert not list(tmp_path.glob("*.db*"))


def test_lock_file_trouble_names_the_file(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Not the storage and not a bug of ours: the one file that failed, exit 1."""
    (tmp_path / "hpo-runs" / ".hpo.db.lock").mkdir(parents=True)
    result = cli("run", "study.n_trials=1")
    assert result.code == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "error: hpo-runs/.hpo.db.lock: Is a directory"
    assert lines[1].startswith("hint: check that the folder exists") and len(lines) == 2


@pytest.fixture
def study_db(tmp_path: Path) -> Path:
    """An Optuna database with one finished trial and our tables, made without a run."""
    import optuna

    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.db.tables import ensure_tables

    db = tmp_path / "hpo.db"
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name="hpo")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    ensure_tables(create_engine(f"sqlite:///{db}", read_only=False))
    return db


@pytest.mark.parametrize("args", [
    ["report", "--out", "/proc/self/report.html"],  # a folder no file can be made in
    ["report", "--out", "taken.html"],
    ["report", "--png", "/proc/self/report.png"],
    ["telemetry", "--csv", "taken.html"],
    ["telemetry", "--csv", "/proc/self/samples.csv"],
], ids=" ".join)
def test_output_that_cannot_be_written_is_bad_input(cli, tmp_path: Path, study_db: Path,  # type: ignore[no-untyped-def]
                                                    args: list[str]) -> None:
    (tmp_path / "taken.html").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    result = cli(*args)
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {args[1]} {args[2]}: ") and lines[1].startswith("hint: ")
    assert len(lines) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("make", ["empty file", "optuna, no study"])
def test_telemetry_on_an_empty_database(cli, tmp_path: Path, make: str) -> None:  # type: ignore[no-untyped-def]
    if make == "empty file":
        (tmp_path / "hpo.db").write_bytes(b"")
    else:
        import optuna

        optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'hpo.db'}").engine.dispose()
    result = cli("telemetry", "--csv", "out.csv")
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("error: ") and "\nhint: " in result.stderr
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["best"]], ids=" ".join)
def test_a_reader_that_leaves_ends_the_command_quietly(tmp_path: Path, study_db: Path,
                                                        args: list[str]) -> None:
    """`status | head`: stdout closed before the command writes: exit 0, nothing on stderr."""
    env = cli_env()
    env.pop("COLUMNS")
    proc = subprocess.Popen([sys.executable, "-m", "hpo_orchestrator", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")


def test_a_password_with_an_unescaped_at_sign_is_masked_whole() -> None:
    """SQLAlchemy ends the password at the first '@' and took the rest for the host: 'ss'
    showed in the `next:` line, --show-config and the study's hpo.config."""
    from hpo_orchestrator.cli import _first_hour as _cli_trials
    from hpo_orchestrator.db.connect import mask_url

    url = "postgresql+psycopg://me:p@s3cret@db/hpo"
    assert mask_url(url) == "postgresql+psycopg://me:***@db/hpo"
    assert "s3cret" not in _cli_trials.next_steps(url, "sqlite:///hpo.db", 3)


def test_a_long_study_name_still_gets_a_run_folder() -> None:
    """Names up to Optuna's 512 characters are valid, a file name holds 255 bytes: a 300-character
    name was created as a study, then the run stopped on 'File name too long'."""
    from hpo_orchestrator.scheduler import run_dir

    first, second = (run_dir("sqlite:///runs/hpo.db", "a" * 299 + end) for end in "xy")
    assert len(first.name) <= 200 and first.name.startswith("a" * 100)
    assert first != second
    assert run_dir("sqlite:///runs/hpo.db", "exp 1").name.startswith("exp_1-")  # hashed: issue 28


# --- the objective's module, imported by the orchestrator to check it --------------------

def _module(tmp_path: Path, text: str) -> None:
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "__init__.py").write_text("")
    (tmp_path / "odd" / "obj.py").write_text(text)


@pytest.mark.parametrize(("text", "target", "message", "hint"), [
    ("import sys\nsys.exit(3)\n", "odd.obj:objective",
     "objective.target: importing 'odd.obj:objective' called sys.exit(3)", "__main__"),
    ("objective = 42\n", "odd.obj:objective",
     "objective.target: 'odd.obj:objective' is a int, not a function", "module:function"),
    ("class Objective:\n    def __init__(self, trial):\n        pass\n", "odd.obj:Objective",
     "objective.target: 'odd.obj:Objective' is a class: called with the trial it builds an "
     "instance, not the trial's value (an instance with __call__(self, trial) in the module does "
     "serve)", "module:function taking the trial"),
    ("async def objective(trial):\n    return 1.0\n", "odd.obj:objective",
     "objective.target: 'odd.obj:objective' is an async function: the run calls it and needs "
     "its value, not a coroutine", "module:function"),
    ("def objective(trial):\n    yield 1.0\n", "odd.obj:objective",
     "objective.target: 'odd.obj:objective' is a generator function (it yields): the run needs "
     "the value it returns", "module:function"),
    ("def objective(trial, data):\n    return 1.0\n", "odd.obj:objective",
     "objective.target: 'odd.obj:objective' takes (trial, data): it is called with the trial, "
     "one argument", "module:function taking the trial"),
    ("def objective():\n    return 1.0\n", "odd.obj:objective",
     "objective.target: 'odd.obj:objective' takes (): it is called with the trial, one argument",
     "module:function taking the trial"),
])
def test_a_module_that_exits_or_names_no_function_is_one_error_line(
        cli, tmp_path: Path, text: str, target: str, message: str, hint: str) -> None:  # type: ignore[no-untyped-def]
    """sys.exit at a module's top ended the run with its code and no word; a target that is
    no function failed every trial with "'int' object is not callable" (exit 1), and a class,
    a coroutine or generator function or one of another signature failed every trial alike."""
    _module(tmp_path, text)
    result = cli("run", f"objective.target={target}", "study.n_trials=2")
    assert result.code == 2 and result.stderr.splitlines()[0] == f"error: {message}", result.stderr
    assert hint in result.stderr and not list(tmp_path.glob("*.db"))


@pytest.mark.parametrize("text", [
    "def objective(trial, data=None):\n    return 1.0\n",
    "def objective(*args):\n    return 1.0\n",
    "class _O:\n    def __call__(self, trial):\n        return 1.0\n\nobjective = _O()\n",
    "import functools\ndef _f(trial, scale):\n    return scale\n"
    "objective = functools.partial(_f, scale=2.0)\n",
])
def test_a_callable_that_takes_the_trial_is_an_objective(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        text: str) -> None:
    from hpo_orchestrator.config import load_config
    from hpo_orchestrator.runner import check_objective

    _module(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    check_objective(load_config(["objective=custom", "objective.target=odd.obj:objective"]))


@pytest.mark.slow
def test_a_module_that_changes_folder_or_starts_a_thread_on_import(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Its os.chdir put hpo.db and hpo-runs/ in the other folder (status here: 'no database');
    its thread, no daemon, kept the orchestrator's process alive after the run, forever."""
    (tmp_path / "elsewhere").mkdir()
    _module(tmp_path, "import os, threading, time\n"
                      "os.chdir(os.path.join(os.getcwd(), 'elsewhere'))\n"
                      "threading.Thread(target=lambda: time.sleep(3600)).start()\n"
                      "def objective(trial):\n    return trial.suggest_float('x', 0, 1)\n")
    result = cli("run", "objective.target=odd.obj:objective", "study.n_trials=2", timeout=120)
    assert result.code == 0, result.stderr
    assert (tmp_path / "hpo.db").exists() and not list((tmp_path / "elsewhere").iterdir())


def test_a_parallel_past_what_the_host_holds_is_refused_with_the_bound(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Accepted, it reserved memory for 10^12 slots (about 90 MB/s) and started no trial."""
    from hpo_orchestrator.config._checks import host_trial_bound

    bound, _why = host_trial_bound()
    result = cli("run", "scheduler.parallel=999999999999", "scheduler.gpus=none")
    assert result.code == 2
    assert result.stderr.splitlines() == [
        f"error: scheduler.parallel: 999999999999 is more than this host can run at once: at "
        f"most {bound} ({_why})", f"hint: set scheduler.parallel={bound} or fewer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no database, no run folder
    assert cli("run", f"scheduler.parallel={bound}", "--show-config").code == 0


# issue 52 item 13: each message says what the user typed wrong, and the fix
@pytest.mark.parametrize("args, error, hint", [
    (["run", "--study", "foo"], "error: hpo-orchestrator run takes no --study",
     "hint: hpo-orchestrator run study.name=foo"),
    (["run", "objective=custom", "objective.target=mypkg/trivial.py:objective"],
     "is a file path, not a module name", "hint: name it as Python imports it: "
     "objective.target=mypkg.trivial:objective"),
    (["run", "objective.search_space.num_leaves.step=0"],
     "error: objective.search_space.num_leaves.step: must be > 0, got 0",
     "objective.search_space.num_leaves.step=null"),
    (["run", "scheduler.trial_timeout_s=abc"], "error: scheduler.trial_timeout_s",
     "hint: check the value's type ('hpo-orchestrator run --show-config' prints every key"),
    # OmegaConf reads any number as a bool (2 as true): a switch takes a word for one
    (["run", "scheduler.spare_workers=2"],
     "error: scheduler.spare_workers: expected true or false, got '2'",
     "hint: scheduler.spare_workers=true or scheduler.spare_workers=false"),
    (["run", "objective.search_space.learning_rate.log=0"],
     "error: objective.search_space.learning_rate.log: expected true or false, got '0'",
     "hint: objective.search_space.learning_rate.log=true or"),
])
def test_a_bad_input_gets_the_fix_for_what_was_typed(cli, args: list[str], error: str,  # type: ignore[no-untyped-def]
                                                      hint: str) -> None:
    result = cli(*args)
    assert result.code == 2, result.stderr
    assert error in result.stderr and hint in result.stderr, result.stderr
    assert "log: true" not in result.stderr and "see conf/" not in result.stderr


@pytest.mark.parametrize("word", ["true", "False", "yes", "off", "'true'"])
def test_a_switch_takes_the_words_for_one(cli, word: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", f"scheduler.spare_workers={word}", "--show-config")
    assert result.code == 0, result.stderr
    expected = word.strip("'").lower() in ("true", "yes")
    assert f"spare_workers: {str(expected).lower()}" in result.stdout
