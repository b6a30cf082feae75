"""Every command we suggest works as typed (issue 30, item 3): tune-pruner's ``run with:``
line, configuration mistakes that name the fix, a syntax error in the objective's module, and
``make -f`` from another folder. (``make logs`` of a silent trial: tests/cli/test_first_hour.py.)"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.cli import main
from hpo_orchestrator.config import load_config
from hpo_orchestrator.config._load import to_plain_dict
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.pruning._command import recommended_command
from tests.conftest import REPO

PRUNER = "pruner=median pruner.n_warmup_steps=3 pruner.n_startup_trials=5"


@pytest.mark.parametrize("given", [
    ["objective=custom", "objective.target=mypkg.objective:objective", "scheduler.parallel=8",
     "study.n_trials=60", "study.direction=maximize", "sampler=random", "sampler.seed=3",
     "telemetry.compute_phases=[train,eval]", "pruner.patience=5"],
    ["objective=lightgbm", "objective.search_space.num_leaves.high=64", "objective.n_rows=5000",
     "scheduler.parallel=2", "storage.url=sqlite:///other.db", "study.name=lgb"],
    [],
])
def test_tune_pruners_command_runs_the_studys_setup_into_a_new_study(given: list[str]) -> None:
    recorded = to_plain_dict(load_config(given))
    url = recorded["storage"]["url"]  # tune-pruner's --storage: where the study is
    command = recommended_command("hpo-orchestrator", recorded["study"]["name"], recorded,
                                  PRUNER, taken={"hpo-median"},
                                  storage=None if url == "sqlite:///hpo.db" else url)
    prog, run, *overrides = shlex.split(command)
    assert (prog, run) == ("hpo-orchestrator", "run")
    again = to_plain_dict(load_config(overrides))  # loads as typed
    want = to_plain_dict(load_config([*(g for g in given if not g.startswith("pruner.")),
                                      *PRUNER.split()]))
    name = recorded["study"]["name"]
    assert again["study"].pop("name") == (f"{name}-median-2" if name == "hpo" else f"{name}-median")
    want["study"].pop("name")
    assert again == want  # the same objective, sampler, budget and parallelism; the new pruner
    parallel = recorded["scheduler"]["parallel"]
    if parallel is None:  # the default (every GPU given): nothing to pass on
        assert not any(o.startswith("scheduler.parallel") for o in overrides)
    else:
        assert f"scheduler.parallel={parallel}" in overrides


@pytest.mark.parametrize("store, copied", [("/work/hpo-runs/lgb/artifacts", False),
                                            ("/shared/hpo-artifacts", True)])
def test_tune_pruners_command_takes_the_storage_it_read_and_a_store_of_its_own(
        store: str, copied: bool) -> None:
    """The recorded URL has its password masked: copied, the command logged in with the
    password '***'. The replayed study's own artifact folder (the default, recorded resolved)
    would have taken the new study's files; a store the user chose is kept."""
    from hpo_orchestrator.db.connect import mask_url, paste_url

    url = "postgresql+psycopg://me:s3cret@db.example/hpo"
    recorded = to_plain_dict(load_config([f"storage.url={url}", "study.name=lgb",
                                          f"artifacts.store={store}"]))
    recorded["storage"]["url"] = mask_url(url)  # as record_config stores it
    shown, note = paste_url(url)
    command = recommended_command("hpo-orchestrator", "lgb", recorded, PRUNER, set(), shown)
    overrides = shlex.split(command)[2:]
    assert "storage.url=postgresql+psycopg://me@db.example/hpo" in overrides
    assert "***" not in command and "s3cret" not in command and note is not None
    assert (f"artifacts.store={store}" in overrides) is copied
    assert load_config(overrides).storage.url == "postgresql+psycopg://me@db.example/hpo"


def test_quoted_commands_name_the_study_and_storage_they_are_about(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --study lgb` of a PostgreSQL study advised 'hpo-orchestrator logs 3': in a
    storage of several studies that shows another study's trial 3, and without --storage it
    reads hpo.db (a dead end)."""
    from hpo_orchestrator.cli import _first_hour
    from hpo_orchestrator.cli._first_hour import as_typed

    monkeypatch.setattr(_first_hour, "prog", lambda: "hpo-orchestrator")  # not pytest's own argv[0]
    monkeypatch.delenv("MAKELEVEL", raising=False)
    url, default = "postgresql+psycopg://me:s3cret@db/hpo", "sqlite:///hpo.db"
    text = ("'hpo-orchestrator logs 3' shows that trial's output and traceback "
            "('hpo-orchestrator status --trial 3' its params)")
    typed = as_typed(text, url, default, "lgb")
    assert "'hpo-orchestrator logs 3 --study lgb --storage postgresql+psycopg://me@db/hpo'" in typed
    assert "'hpo-orchestrator status --trial 3 --study lgb --storage postgresql+psycopg://me@db/hpo'" \
        in typed and "s3cret" not in typed
    assert as_typed("'hpo-orchestrator logs 3 --study x'", default, default, "lgb") == \
        "'hpo-orchestrator logs 3 --study x'"  # one the message names already
    monkeypatch.setenv("MAKELEVEL", "1")  # under make, the default storage, no study given
    assert as_typed("'hpo-orchestrator logs 3'", default, default) == "'make logs TRIAL=3'"
    assert as_typed("'hpo-orchestrator logs 3'", default, default, "lgb") == \
        "'hpo-orchestrator logs 3 --study lgb'"


def test_tune_pruner_prints_that_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hpo_orchestrator.scheduler import run_dir

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=url, study_name="exp 1")  # its folder: exp_1-<hash>
    recorded = to_plain_dict(load_config(["scheduler.parallel=6", "study.name='exp 1'"]))
    recorded["artifacts"]["store"] = str(run_dir(url, "exp 1") / "artifacts")  # as a run records it
    study.set_user_attr("hpo.config", recorded)

    def objective(trial: optuna.Trial) -> float:
        for step in range(1, 6):
            trial.report(trial.number / step, step)
        return float(trial.number)

    study.optimize(objective, n_trials=8)
    assert main(["tune-pruner", "--storage", url, "--json", "--patience", "0"]) == 0
    command = json.loads(capsys.readouterr().out)["recommendation"]["command"]
    assert "scheduler.parallel=6" in command and "exp 1-" in command
    assert "artifacts.store" not in command  # the new study gets a folder of its own
    assert main(["tune-pruner", "--storage", url, "--patience", "0"]) == 0
    assert f"run with: {command}" in " ".join(capsys.readouterr().out.split())  # wrapped or not


# --- configuration mistakes name the fix -------------------------------------------------

@pytest.mark.parametrize("overrides, message, hint", [
    (["scheduler.paralel=4"], "'scheduler.paralel'", "did you mean 'scheduler.parallel'?"),
    (["parallel=4"], "'parallel'", "did you mean 'scheduler.parallel'?"),
    (["studdy.name=x"], "'studdy'", "did you mean 'study.name'?"),
    (["+study.nme=x"], "'study.nme'", "did you mean 'study.name'?"),
    (["pruner.n_warmup_steps=3"], "'pruner.n_warmup_steps'",
     "pruner.n_warmup_steps is a key of pruner=median: use pruner=median"),
    (["objective=lightgbm", "objective.target=a.b:c"], "'objective.target'",
     "objective.target is a key of objective=custom: use objective=custom"),
    (["objective.search_space.num_leaf.high=3"], "'objective.search_space.num_leaf'",
     "did you mean 'objective.search_space.num_leaves.high'? fields: low, high"),
    (["scheduler.nope=1"], "'scheduler.nope'", "'hpo-orchestrator run --show-config' prints every key"),
])
def test_an_unknown_key_gets_a_did_you_mean_and_the_show_config_hint(
        overrides: list[str], message: str, hint: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(overrides)
    assert raised.value.message == f"unknown configuration key {message}"
    assert raised.value.hint is not None and hint in raised.value.hint
    if "search_space" not in message:
        assert "run --show-config" in raised.value.hint
    if "nope" in message:  # nothing near enough: no guess
        assert "did you mean" not in raised.value.hint


def test_objective_target_alone_implies_objective_custom(capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(["objective.target=mypkg.objective:objective"])
    assert config.objective.name == "custom" and config.objective.target == "mypkg.objective:objective"
    assert load_config(["objective.setup=mypkg.objective:setup",
                        "objective.target=mypkg.objective:objective"]).objective.name == "custom"
    assert main(["run", "--show-config", "objective.target=mypkg.objective:objective"]) == 0
    assert "name: custom" in capsys.readouterr().out


# --- the objective's module: the hint that matches what went wrong -------------------------

@pytest.mark.parametrize("source, message, hint", [
    ("def objective(trial)\n    return 1.0\n", "SyntaxError in {file}:1: expected ':'",
     "fix the syntax at {file}:1: def objective(trial)"),
    ("def objective(trial):\nreturn 1.0\n", "IndentationError in {file}:2",
     "fix the syntax at {file}:2: return 1.0"),
    ("import no_such_dependency_xyz\n", "it imports 'no_such_dependency_xyz', which is not installed",
     "-m pip install"),
    ("x = 1\ny = undefined_name\n", "importing it raised NameError: name 'undefined_name' is not "
     "defined", "the error is in the module's own code at {file}:2"),
    ("def other(trial):\n    return 1.0\n", "module 'badmod.obj' has no 'objective'",
     "the name after ':' is a function of badmod.obj"),
], ids=["syntax", "indentation", "missing-dependency", "raises", "no-such-function"])
def test_an_objective_module_that_does_not_import_gets_the_hint_that_fits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str,
        hint: str) -> None:
    from hpo_orchestrator.runner import check_objective

    (tmp_path / "badmod").mkdir()
    (tmp_path / "badmod" / "__init__.py").write_text("")
    file = tmp_path / "badmod" / "obj.py"
    file.write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "badmod", raising=False)
    monkeypatch.delitem(sys.modules, "badmod.obj", raising=False)
    with pytest.raises(ConfigError) as raised:
        check_objective(load_config(["objective.target=badmod.obj:objective"]))
    assert raised.value.message.startswith("objective.target: cannot import 'badmod.obj:objective'")
    assert message.format(file=file) in raised.value.message
    assert raised.value.hint is not None and hint.format(file=file) in raised.value.hint
    assert "current folder" not in raised.value.hint


def test_a_module_that_is_not_there_still_gets_the_folder_hint() -> None:
    from hpo_orchestrator.runner import check_objective

    with pytest.raises(ConfigError) as raised:
        check_objective(load_config(["objective.target=no_such_module_xyz.obj:objective"]))
    assert raised.value.hint is not None and "current folder" in raised.value.hint


# --- make -f from another folder ---------------------------------------------------------

def test_make_f_from_another_folder_uses_the_checkouts_venv_or_says_make_c(tmp_path: Path) -> None:
    makefile = str(REPO / "Makefile")
    # as typed in a shell: not a sub-make of `make test-fast` (which prints its directories)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    dry = subprocess.run(["make", "-n", "-f", makefile, "hpo", "PAR=2"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=env)
    assert dry.returncode == 0, dry.stderr
    last = dry.stdout.strip().splitlines()[-1].strip()  # run here, with the checkout's venv
    assert last.startswith("/") and last.endswith(
        f"{REPO.name}/.venv/bin/hpo-orchestrator run scheduler.parallel=2")
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(storage=url, study_name="here").optimize(lambda t: 1.0, n_trials=1)
    status = subprocess.run(["make", "-s", "-f", makefile, "status"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=env)
    assert status.returncode == 0, status.stderr
    assert "here" in status.stdout  # the study in this folder's hpo.db
    for target in ("test", "lint"):
        refused = subprocess.run(["make", "-f", makefile, target], cwd=tmp_path,
                                 capture_output=True, text=True, timeout=60, env=env)
        assert refused.returncode == 2
        assert "use 'make -C /" in refused.stderr and f"{REPO.name} {target}'" in refused.stderr


def test_commands_suggested_under_make_f_run_where_the_user_is(tmp_path: Path) -> None:
    """From another folder (`make -f <checkout>/Makefile status`), a finding's advice said
    'make logs TRIAL=N', which finds no rule there: it says the -f, and that command runs."""
    makefile = str(REPO / "Makefile")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "HPO_MAKE")}
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="here")
    study.tell(study.ask(), 1.0)
    failed = study.ask()
    failed.set_user_attr("hpo.fail_reason", "exception")
    failed.set_user_attr("hpo.error", "ValueError: bad x")
    failed.set_user_attr("hpo.traceback", "Traceback (most recent call last):\nValueError: bad x")
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    status = subprocess.run(["make", "-s", "-f", makefile, "status"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=env)
    assert status.returncode == 0, status.stderr
    suggested = f"make -f {makefile} logs TRIAL=1"
    assert f"'{suggested}'" in status.stdout, status.stdout
    assert "'make logs" not in status.stdout
    logs = subprocess.run([*shlex.split(suggested), "-s"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert logs.returncode == 0, logs.stderr
    assert "ValueError: bad x" in logs.stdout


def test_tune_pruners_command_keeps_the_studys_own_pruner_options() -> None:
    """The replay kept the options its grid does not vary (patience_mode, min_delta); the
    command that runs the recommendation keeps them too where the pruner is the one the study
    ran, and drops them for another pruner (they are another pruner's)."""
    recorded = to_plain_dict(load_config(["pruner.patience_mode=delay", "pruner.min_delta=0.01",
                                          "pruner.patience=5"]))
    same = "pruner=patient_hyperband pruner.patience=1 pruner.min_resource=3 pruner.reduction_factor=3"
    overrides = shlex.split(recommended_command("hpo-orchestrator", "hpo", recorded, same, set()))[2:]
    pruner = to_plain_dict(load_config(overrides))["pruner"]
    assert (pruner["patience_mode"], pruner["min_delta"], pruner["patience"]) == ("delay", 0.01, 1)
    assert "pruner.tune=off" not in overrides  # the default: not repeated
    other = shlex.split(recommended_command("hpo-orchestrator", "hpo", recorded, PRUNER, set()))[2:]
    assert not any(o.startswith(("pruner.patience_mode", "pruner.min_delta")) for o in other)
