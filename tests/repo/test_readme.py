"""Every example in README.md and in the docs it moved its examples to (DOCS), as written:
their shell commands, their Python and the README's SQL.

The fenced blocks are read from the files themselves. Each shell command must be listed in
COMMANDS with how it is tested, so a command added to the README without a test fails here
(and a listed command the README dropped too). Most run verbatim, in the order a new user
types them, in a fresh folder that has the checkout's Makefile and .venv and the venv on PATH
(as after `. .venv/bin/activate`); the few that need a server, Slurm or many GPU-hours are
run with ``--show-config`` (their overrides are still checked) or named with the test that
covers them.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, _require_slow, cli_env

README = REPO / "README.md"
# The docs the README's longer examples moved to: their shell blocks are held to COMMANDS too.
DOCS = [REPO / "docs" / "OBJECTIVES.md", REPO / "docs" / "REPORT.md", REPO / "docs" / "HOSTS.md"]

VERBATIM = "run verbatim"
CONFIG = "run with --show-config appended (needs a server or hours; its overrides are checked)"
WATCH = "run verbatim until its first screen, then stopped (it refreshes forever)"
SEVERAL = "run verbatim by test_several_objectives_as_written (its own folder and study)"
KEEP = "run verbatim by test_keeping_a_trials_files (its own study: no make hpo first)"

COMMANDS: dict[str, str] = {
    "make hpo": VERBATIM,
    "make test": "not run here: it is this test suite",
    "make status": VERBATIM,
    "make report": VERBATIM,
    "make logs TRIAL=3": VERBATIM,
    'make hpo PAR=8 ARGS="objective=torch_mlp study.name=mlp study.n_trials=100"':
        "make -n shows the command; that command is " + CONFIG,
    "hpo-orchestrator run --show-config": VERBATIM,
    "hpo-orchestrator status": VERBATIM,
    "hpo-orchestrator status --storage sqlite:///hpo.db --study hpo --json": VERBATIM,
    "hpo-orchestrator status --watch": WATCH,
    "hpo-orchestrator submit slurm.nodes=4 slurm.gpus_per_node=8 slurm.partition=gpu "
    "storage.url=postgresql+psycopg://user@db/hpo study.n_trials=2000":
        "not run here: needs Slurm (tests/cluster/test_cluster.py submits to the local Slurm)",
    "hpo-orchestrator run objective=custom objective.target=mypkg.objective:objective study.name=mypkg":
        VERBATIM,
    "hpo-orchestrator run objective=custom objective.target=mypkg.tradeoff:objective "
    "'study.directions=[minimize,minimize]' pruner=none study.name=tradeoff study.n_trials=12":
        SEVERAL,
    "hpo-orchestrator best --study tradeoff --index 0": SEVERAL,
    "hpo-orchestrator logs 3 --study mypkg": VERBATIM,
    "hpo-orchestrator status --trial 3 --study mypkg": VERBATIM,
    "hpo-orchestrator report --study hpo --out report.html --png report.png": VERBATIM,
    "hpo-orchestrator tune-pruner --study hpo --top-k 5 --patience 0,1,2,3,5,8 "
    "--min-resource 1,2,3,5,8,13 --reduction-factor 2,3,4": VERBATIM,
    "hpo-orchestrator run pruner.min_resource=auto pruner.startup_share=0.25 study.name=auto": CONFIG,
    'pip install -e ".[postgres]"': "not run here: installs packages (make install has the extra's psycopg)",
    "hpo-orchestrator run storage.url=postgresql+psycopg://user@db-host/hpo study.name=exp1 "
    "study.n_trials=400 scheduler.parallel=8": CONFIG,
    "hpo-orchestrator best --study NAME [--json]": "synopsis: its form 'best --study mine' runs verbatim",
    "hpo-orchestrator enqueue --study NAME --params '{\"x\": 1.5}'":
        "synopsis: its form 'enqueue --study mine --params ...' runs verbatim",
    "hpo-orchestrator run objective.data=train.csv objective.target_column=label "
    "objective.search_space.learning_rate.high=0.1 objective.search_space.max_depth.value=6 "
    "study.name=mine study.n_trials=8 study.timeout_s=600 scheduler.parallel=2": VERBATIM,
    "hpo-orchestrator best --study mine": VERBATIM,
    "hpo-orchestrator run objective=custom objective.target=mypkg.keep:objective study.name=keep "
    "study.n_trials=6": KEEP,
    "hpo-orchestrator artifacts --study keep --best --out best-model": KEEP,
    "hpo-orchestrator enqueue --study mine --params '{\"learning_rate\": 0.05, \"num_leaves\": 31}'":
        VERBATIM,
    "hpo-orchestrator run objective.data=train.csv objective.target_column=label "
    "objective.search_space.learning_rate.high=0.1 objective.search_space.max_depth.value=6 "
    "study.name=mine study.n_trials=9 scheduler.parallel=2": VERBATIM,
}


def blocks(language: str, files: list[Path] | None = None) -> list[str]:
    """The fenced blocks of ``language`` in ``files`` (the README alone by default), in order."""
    return [block for path in (files or [README])
            for block in re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), flags=re.S | re.M)]


def shell_commands() -> list[str]:
    """Each command of the README's and DOCS' sh blocks: continuation lines joined, comments
    dropped."""
    commands = []
    for block in blocks("sh", [README, *DOCS]):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def test_every_readme_command_has_a_test() -> None:
    found = shell_commands()
    assert len(found) >= 15  # the extraction found the README's commands
    assert sorted(set(found) - set(COMMANDS)) == [], "README commands without a test: add them to COMMANDS"
    assert sorted(set(COMMANDS) - set(found)) == [], "COMMANDS the README (and DOCS) no longer have"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_readmes_list_of_studies_is_one_short_row_a_study(tmp_path: Path, backend: str,
                                                               request: pytest.FixtureRequest) -> None:
    """`optuna studies` prints each study's whole hpo.config, which the contract keeps whole
    (docs/RECORDING.md, "Listing the studies"): the README's SQL lists the studies one short
    row each, on sqlite and on PostgreSQL."""
    import uuid

    import optuna
    import sqlalchemy

    from hpo_orchestrator.config import load_config, to_plain_dict

    [statement] = [s for block in blocks("sql") for s in block.split(";")
                   if "-- the studies, one row each" in s]
    url = f"sqlite:///{tmp_path / 'hpo.db'}" if backend == "sqlite" \
        else str(request.getfixturevalue("postgres_url"))
    name = f"listed-{uuid.uuid4().hex[:8]}"
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name=name)
    config = to_plain_dict(load_config([]))
    study.set_user_attr("hpo.config", config)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    try:
        with storage.engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text(statement)).all()
    finally:
        storage.engine.dispose()
    [row] = [r for r in rows if r[0] == name]
    assert row[1] == 1 and row[2] is not None
    assert len(" | ".join(map(str, row))) < 80 < len(str(config))


def test_python_examples_compile() -> None:
    """Every Python block is valid Python; the first (the custom objective) also runs below."""
    examples = blocks("python", [README, *DOCS])
    assert len(examples) >= 3
    for number, example in enumerate(examples):
        compile(example, f"README python block {number}", "exec")


def test_the_readme_reads_in_ten_minutes() -> None:
    """issue 30: the README answers, in this order, what it is, set-up, your objective on your
    GPUs, what is recorded, everyday commands, reliability and where the rest is; headings, not
    bold lead-ins; no internal history; no timings (a figure lives in the doc that measured it)."""
    text = README.read_text()
    assert len(text.splitlines()) < 250
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings == ["Set-up", "Your own objective on your GPUs", "What is recorded, and how to query it",
                        "Everyday commands", "Reliability", "Further reading"]
    reliability = text.split("\n## Reliability\n", 1)[1].split("\n## ", 1)[0].strip()
    assert 3 <= len(reliability.splitlines()) <= 6 and "docs/RELIABILITY.md" in reliability
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    assert not re.search(r"^\*\*", prose, flags=re.M), "a bold lead-in: make it a heading"
    assert not re.search(r"\bissue \d+|\bruns [A-Z]-[A-Z]\b", prose)
    assert not re.search(r"\d\s*(s|seconds|min|minutes)\b", prose), "a timing without its command"
    # The stand-in's supported reads stay listed (issue 30, item 1).
    assert "`trial.study`: `direction`, `directions`, `study_name`" in text
    assert "`scheduler.parallel` unset" in text or "`scheduler.parallel`" in text


def test_readme_and_docs_links_resolve() -> None:
    """Every relative link of the README and the docs it moved text to names a file that is
    there."""
    for path in [README, *DOCS, REPO / "docs" / "CONFIGURATION.md", REPO / "docs" / "RECORDING.md",
                 REPO / "docs" / "TESTING.md"]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.exists(), f"{path.name}: {target}"


def _show_config(command: str, tmp_path: Path) -> None:
    proc = subprocess.run(f"{command} --show-config", shell=True, cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (command, proc.stderr)


def _env() -> dict[str, str]:
    """As after `. .venv/bin/activate`: the venv's bin first on PATH."""
    env = cli_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    return env


@pytest.mark.long
def test_commands_that_need_a_server_have_valid_overrides(tmp_path: Path) -> None:
    for command, how in COMMANDS.items():
        if how == CONFIG:
            _show_config(command, tmp_path)
    dry = subprocess.run(
        ["make", "-n", "hpo", "PAR=8", "ARGS=objective=torch_mlp study.name=mlp study.n_trials=100"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "hpo-orchestrator run scheduler.parallel=8 objective=torch_mlp study.name=mlp " \
        "study.n_trials=100" in dry
    _show_config("hpo-orchestrator run scheduler.parallel=8 objective=torch_mlp study.name=mlp "
                 "study.n_trials=100", tmp_path)


def _write_train_csv(path: Path) -> None:
    """A small table with a binary ``label`` column, a numeric and a text feature."""
    import random

    rng = random.Random(0)
    lines = ["a,b,color,label"]
    for _ in range(400):
        a, b = rng.random(), rng.random()
        color = rng.choice(["red", "green", "blue"])
        lines.append(f"{a:.4f},{b:.4f},{color},{int(a + 0.3 * (color == 'red') > 0.6)}")
    path.write_text("\n".join(lines) + "\n")


def _sh(command: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(command, shell=True, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.timeout(1800)  # make hpo's 40 LightGBM trials, then the custom study, on a shared VM
def test_the_readme_in_order(tmp_path: Path) -> None:
    """A new user's first hour, every command as the README writes it."""
    _require_slow("runs the README's studies")
    venv = Path(sys.executable).parent.parent
    (tmp_path / "Makefile").write_text((REPO / "Makefile").read_text())
    (tmp_path / "pyproject.toml").symlink_to(REPO / "pyproject.toml")
    (tmp_path / ".venv").symlink_to(venv)
    if not (venv / ".installed").exists() or \
            (venv / ".installed").stat().st_mtime < (REPO / "pyproject.toml").stat().st_mtime:
        pytest.skip("make install first (the Makefile would reinstall into the checkout's .venv)")
    run = {command: how for command, how in COMMANDS.items() if how == VERBATIM}

    made = _sh("make hpo", tmp_path)
    assert "this run: " in made.stdout and "next: make status  |  make report" in made.stdout
    for command in ("make status", "make report", "make logs TRIAL=3"):
        out = _sh(command, tmp_path)
        assert "Error" not in out.stderr
    assert (tmp_path / "report.html").exists()

    objective = tmp_path / "mypkg" / "objective.py"
    objective.parent.mkdir()
    objective.write_text(blocks("python")[0])  # as written, without an __init__.py either
    custom = _sh("hpo-orchestrator run objective=custom objective.target=mypkg.objective:objective "
                 "study.name=mypkg", tmp_path)
    assert "failed 0" in custom.stdout, custom.stdout
    logs = _sh("hpo-orchestrator logs 3 --study mypkg", tmp_path)
    assert "trial 3 on slot" in logs.stdout
    assert "COMPLETE" in _sh("hpo-orchestrator status --trial 3 --study mypkg", tmp_path).stdout \
        or "PRUNED" in _sh("hpo-orchestrator status --trial 3 --study mypkg", tmp_path).stdout

    _write_train_csv(tmp_path / "train.csv")  # docs/OBJECTIVES.md: "Here train.csv has a label column"
    for command in [c for c in COMMANDS if COMMANDS[c] == VERBATIM
                    and ("--study mine" in c or "study.name=mine" in c)]:  # in the README's order
        _sh(command, tmp_path)
        run.pop(command)
    best = _sh("hpo-orchestrator best --study mine", tmp_path)
    assert "best trial #" in best.stdout

    for command in ("hpo-orchestrator run --show-config", "hpo-orchestrator status",
                    "hpo-orchestrator status --storage sqlite:///hpo.db --study hpo --json",
                    "hpo-orchestrator report --study hpo --out report.html --png report.png",
                    "hpo-orchestrator tune-pruner --study hpo --top-k 5 --patience 0,1,2,3,5,8 "
                    "--min-resource 1,2,3,5,8,13 --reduction-factor 2,3,4"):
        _sh(command, tmp_path)
        run.pop(command)
    for command in ("make hpo", "make status", "make report", "make logs TRIAL=3",
                    "hpo-orchestrator run objective=custom objective.target=mypkg.objective:objective "
                    "study.name=mypkg", "hpo-orchestrator logs 3 --study mypkg",
                    "hpo-orchestrator status --trial 3 --study mypkg"):
        run.pop(command)
    assert run == {}, "a VERBATIM command this test does not run"

    watch = subprocess.Popen("hpo-orchestrator status --watch", shell=True, cwd=tmp_path, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    # Off a terminal it prints one summary per interval: stop it once it reads the study
    # (past its imports, the database open), and a refresh later, not after a fixed 5 s
    # that a loaded machine spends importing.
    _wait_until_reading(watch.pid, tmp_path / "hpo.db")
    time.sleep(2.5)  # its first screen (a read of a small study) and a refresh (every 2 s)
    os.killpg(watch.pid, signal.SIGINT)
    out, _err = watch.communicate(timeout=60)
    assert watch.returncode in (130, -signal.SIGINT) and "trials by state" in out

    with sqlite3.connect(tmp_path / "hpo.db") as connection:
        for block in blocks("sql"):
            for statement in filter(str.strip, block.split(";")):
                rows = connection.execute(statement).fetchall()
                assert rows, statement


@pytest.mark.slow
def test_several_objectives_as_written(tmp_path: Path) -> None:
    """The 'Several objectives' example: its objective file and commands, as the README has them."""
    _require_slow("runs the README's multi-objective study")
    example = next(b for b in blocks("python", DOCS) if b.startswith("# mypkg/tradeoff.py"))
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "tradeoff.py").write_text(example)
    run, best = (c for c, how in COMMANDS.items() if how == SEVERAL)
    ran = _sh(run, tmp_path)
    assert "complete 12, pruned 0, failed 0" in ran.stdout and "Pareto front" in ran.stdout
    assert "pruner: off" not in ran.stderr  # the example says pruner=none itself
    picked = _sh(best, tmp_path)
    assert re.search(r"Pareto front, \d+ trial\(s\); selected: trial #\d+", picked.stdout)
    assert "width" in picked.stdout and "enqueue:" in picked.stdout


@pytest.mark.slow
def test_keeping_a_trials_files(tmp_path: Path) -> None:
    """The README's save_artifact objective and its two commands, as written: the best trial's
    file comes back as the objective wrote it."""
    _require_slow("runs the README's artifact study")
    example = next(b for b in blocks("python", DOCS) if b.startswith("# mypkg/keep.py"))
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "keep.py").write_text(example)
    keep = [command for command, how in COMMANDS.items() if how == KEEP]
    assert len(keep) == 2
    for command in keep:  # in the README's order
        _sh(command, tmp_path)
    import optuna

    best = optuna.load_study(study_name="keep", storage=f"sqlite:///{tmp_path}/hpo.db").best_trial
    fetched = tmp_path / "best-model" / f"model-{best.number}.txt"
    assert fetched.read_text() == f"x={best.params['x']!r}\n"
    assert sorted(p.name for p in (tmp_path / "best-model").iterdir()) == [fetched.name]


def _wait_until_reading(pid: int, db: Path, timeout_s: float = 120.0) -> None:
    """Until a process of ``pid``'s tree has ``db`` open (status has imported and read it)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            root = psutil.Process(pid)
            for proc in (root, *root.children(recursive=True)):
                if any(Path(f.path) == db for f in proc.open_files()):
                    return
        except psutil.Error:
            pass
        time.sleep(0.1)
    raise AssertionError(f"status --watch never opened {db}")


def test_make_test_prints_why_tests_skipped() -> None:
    """The README's `make test` says skipped tests print their reason: pytest's -rs, on every
    suite target (issue 30: 119 skips went unexplained)."""
    for target in ("test", "test-long", "test-fast", "test-gpu"):
        dry = subprocess.run(["make", "-n", target, "VENV=/nonexistent/venv"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        assert re.search(r"-m pytest -q .*-rs|-m pytest -q -rs", dry), (target, dry)
