"""A custom objective's search space edited between two runs of one study (issue 52 item 12):
the run is refused with exit 2 and a hint naming a new ``study.name``, at the first suggest
of the changed name, before more trials are spent (docs/OBJECTIVES.md "Exit codes")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, trial_rows

ARGS = ("run", "objective=custom", "objective.target=tests.objectives:ranged",
        "scheduler.parallel=1", "pruner=none")


@pytest.mark.slow
@pytest.mark.parametrize("edit, shown", [
    ({"HPO_TEST_X_HIGH": "2"}, "x was float(low=-1.0, high=1.0) in study 'hpo', this run "
                               "suggests float(low=-1.0, high=2.0)"),
    ({"HPO_TEST_X_KIND": "categorical"}, "this run suggests categorical(choices=(0, 1))"),
])
def test_a_changed_space_is_refused_with_a_new_study_name(tmp_path: Path, edit: dict[str, str],
                                                          shown: str) -> None:
    first = run_cli(tmp_path, *ARGS, "study.n_trials=2")
    assert first.code == 0, first.stderr
    changed = run_cli(tmp_path, *ARGS, "study.n_trials=10", env=edit)
    assert changed.code == 2, (changed.code, changed.stderr)
    assert "error: the search space changed: " in changed.stderr and shown in changed.stderr, \
        changed.stderr
    assert "hint: " in changed.stderr and "study.name=hpo-2" in changed.stderr
    assert "fix the objective and run the same command again" not in changed.stderr
    assert "Traceback" not in changed.stderr
    # one trial (the one that met the change) failed; no more were spent
    failed = [r for r in trial_rows(changed.db) if r["state"] == "FAIL"]
    assert len(failed) == 1, failed
    # the hint's command runs: a new study of the new space
    again = run_cli(tmp_path, *ARGS, "study.n_trials=2", "study.name=hpo-2", env=edit)
    assert again.code == 0, again.stderr


@pytest.mark.slow
def test_allow_mixed_and_an_unchanged_space_run(tmp_path: Path) -> None:
    assert run_cli(tmp_path, *ARGS, "study.n_trials=2").code == 0
    same = run_cli(tmp_path, *ARGS, "study.n_trials=4")
    assert same.code == 0, same.stderr
    mixed = run_cli(tmp_path, *ARGS, "study.n_trials=6", "study.allow_mixed=true",
                    env={"HPO_TEST_X_HIGH": "2"})
    assert mixed.code == 0, mixed.stderr
    assert [r["state"] for r in trial_rows(mixed.db)].count("COMPLETE") == 6
