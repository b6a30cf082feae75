"""The mutation list (tests/mutations/*.toml, run by `make mutation`) stays in step with the
code: each snippet is in its file exactly once and each guarding test exists. Code that moves
fails here, in the fast tier, instead of turning into an error of the slow mutation run; and the
runner's own rules (apply in a scratch copy, restore, read pytest's verdict) are checked on a
tiny tree."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_runner", REPO / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


runner = _runner()
MUTATIONS = runner.load()


def test_there_are_enough_and_each_says_why() -> None:
    assert len(MUTATIONS) >= 20
    assert all(len(m.why) > 40 for m in MUTATIONS)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_snippet_is_in_its_file_once(mutation: Any) -> None:
    text = (REPO / mutation.file).read_text()
    assert text.count(mutation.original) == 1, (
        f"{mutation.name}: the snippet is in {mutation.file} {text.count(mutation.original)} times; "
        f"update tests/mutations/{mutation.source} to the moved code")


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_guarding_tests_exist(mutation: Any) -> None:
    for node in mutation.tests:
        path, _, name = node.partition("::")
        source = (REPO / path).read_text()
        function = re.sub(r"\[.*\]$", "", name)
        assert not function or re.search(rf"^def {function}\(", source, re.M), f"{node} not found"


def _edit(original: str, replacement: str) -> Any:
    return runner.Mutation(name="m", file="tinycode.py", original=original, replacement=replacement,
                           tests=("test_code.py",), k=None, why="", timeout_s=120.0, source="t.toml")


def test_a_moved_snippet_is_an_error_and_the_file_is_restored(tmp_path: Path) -> None:
    (tmp_path / "tinycode.py").write_text("X = 1\n")
    result = runner.run_one(tmp_path, _edit("X = 2", "X = 3"))
    assert result.outcome == "error" and "found 0 times" in result.detail
    assert (tmp_path / "tinycode.py").read_text() == "X = 1\n"


@pytest.mark.slow
def test_killed_and_survived_are_told_apart(tmp_path: Path) -> None:
    """A guarded and an unguarded edit of a tiny tree, through the real pytest."""
    pristine = "def double(x):\n    return 2 * x\n\n\ndef unused():\n    return 1\n"
    (tmp_path / "tinycode.py").write_text(pristine)
    (tmp_path / "test_code.py").write_text("from tinycode import double\n\n\n"
                                           "def test_double():\n    assert double(3) == 6\n")
    assert runner.run_one(tmp_path, _edit("return 2 * x", "return x + 2")).outcome == "killed"
    assert runner.run_one(tmp_path, _edit("return 1", "return 0")).outcome == "survived"
    assert (tmp_path / "tinycode.py").read_text() == pristine
