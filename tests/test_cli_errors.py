"""Bad input through the real command: exit 2, one `error:` line and a hint, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

CASES = [
    ["scheduler.parallel=four"],
    ["scheduler.nope=1"],
    ["pruner.patience=-2"],
    ["pruner.min_resource=9", "pruner.max_resource=3"],
    ["objective=nope"],
    ["objective=custom", "objective.target=no_such_module_xyz:objective"],
    ["objective=custom", "objective.target=hpo_orchestrator.testing.objectives:missing"],
    ["scheduler.gpus=[7]"],
    ["storage.url=sqlite:///no/such/folder/hpo.db"],
    ["storage.url=postgresql+psycopg://user:s3cret@127.0.0.1:1/db"],
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o))
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
