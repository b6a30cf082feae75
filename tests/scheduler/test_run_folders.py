"""Issue 28 item 5: study names that differ only in punctuation or non-ASCII letters never
share a run folder (logs, process records, artifacts); a name that is already safe keeps the
folder it always had."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo_orchestrator.scheduler import run_dir
from tests.conftest import run_cli, trial_rows

URL = "sqlite:///runs/hpo.db"


@pytest.mark.parametrize(("one", "other"), [("exp 1", "exp_1"), ("Σx", "Δx"), ("a/b", "a:b"),
                                            ("exp 1", "exp  1"), (".x", "x")])
def test_names_that_look_alike_get_their_own_folders(one: str, other: str) -> None:
    assert run_dir(URL, one) != run_dir(URL, other)
    assert run_dir(URL, one) == run_dir(URL, one)  # the same name finds its folder again


@pytest.mark.parametrize("name", ["hpo", "exp_1", "my-study.v2", "A" * 200])
def test_a_safe_name_keeps_its_folder(name: str) -> None:
    assert run_dir(URL, name).name == name


@pytest.mark.slow
def test_logs_follow_the_study(tmp_path: Path) -> None:
    """Two studies of one database, 'Σx' and 'Δx': each one's `logs 0` shows its own trial
    (it showed the other study's output)."""
    (tmp_path / "said.py").write_text(
        "def sigma(trial):\n    print('this is sigma', flush=True)\n    return 1.0\n"
        "def delta(trial):\n    print('this is delta', flush=True)\n    return 2.0\n")
    for name, function in (("Σx", "sigma"), ("Δx", "delta")):
        result = run_cli(tmp_path, "run", "objective=custom", f"objective.target=said:{function}",
                         "study.n_trials=1", f"study.name=\"{name}\"")
        assert result.code == 0, result.stderr
    folders = sorted(p.name for p in (tmp_path / "hpo-runs").iterdir() if p.is_dir())
    assert len(folders) == 2, folders
    for name, function in (("Σx", "sigma"), ("Δx", "delta")):
        log = Path(trial_rows(tmp_path / "hpo.db", name)[0]["attrs"]["hpo.log_path"])
        assert log.parent == run_dir(f"sqlite:///{tmp_path / 'hpo.db'}", name)
        shown = run_cli(tmp_path, "logs", "0", "--study", name)
        assert shown.code == 0, shown.stderr
        assert f"this is {function}" in shown.stdout and "this is" not in shown.stdout.replace(
            f"this is {function}", ""), shown.stdout
