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

REPO = Path(__file__).resolve().parents[2]


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


# --- what CI runs: the touched edits and a rotating sample ----------------------------------

def _git(repo: Path, *args: str, at: int | None = None) -> str:
    import os
    import subprocess

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    if at is not None:
        env["GIT_COMMITTER_DATE"] = env["GIT_AUTHOR_DATE"] = f"{at} +0000"
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _commit(repo: Path, at: int, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"at {at}", at=at)
    return _git(repo, "rev-parse", "HEAD")


def test_the_landed_file_names_the_base_when_it_is_an_ancestor(tmp_path: Path) -> None:
    """A session longer than the window: the commit .ci/landed names is the base, not the
    window's; a name that is no ancestor of HEAD (a typo, another history) falls back."""
    _git(tmp_path, "init", "-q", "-b", "main")
    hour = 3600
    landed = _commit(tmp_path, 1_700_000_000, {"a": "1"})
    early = _commit(tmp_path, 1_700_000_000 + hour, {"a": "2"})  # the session's first commit
    _commit(tmp_path, 1_700_000_000 + 9 * hour, {"a": "3", ".ci/landed": landed + "\n"})
    assert runner.submission_base(tmp_path, window_s=3 * hour) == landed
    (tmp_path / ".ci" / "landed").write_text(landed[:12] + "  # abbreviated\n")
    assert runner.submission_base(tmp_path, window_s=3 * hour) == landed
    (tmp_path / ".ci" / "landed").write_text("0" * 40 + "\n")
    assert runner.submission_base(tmp_path, window_s=3 * hour) == early


def _named(name: str, file: str = "pkg/a.py", tests: tuple[str, ...] = ("tests/test_a.py::t",)) -> Any:
    return runner.Mutation(name=name, file=file, original="x", replacement="y", tests=tests, k=None,
                           why="", timeout_s=1.0, source="t.toml")


def test_the_last_landed_commit_is_the_newest_first_parent_one_before_the_window(
        tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    hour = 3600
    old = _commit(tmp_path, 1_700_000_000, {"a": "1"})
    landed = _commit(tmp_path, 1_700_000_000 + hour, {"a": "2"})
    own = _commit(tmp_path, 1_700_000_000 + 5 * hour, {"a": "3"})  # the submission's first
    _git(tmp_path, "checkout", "-q", "-b", "side", landed)  # a branch merged in it, made
    _commit(tmp_path, 1_700_000_000 + 6 * hour, {"b": "1"})     # in the same session
    _git(tmp_path, "checkout", "-q", "main")
    _git(tmp_path, "merge", "-q", "--no-ff", "-m", "merge", "side", at=1_700_000_000 + 7 * hour)
    assert runner.submission_base(tmp_path, window_s=3 * hour) == landed
    # main's own line, not the merged branch's newer commit (at 6 h), stands for what landed
    assert runner.submission_base(tmp_path, window_s=hour // 2) == own
    assert runner.submission_base(tmp_path, window_s=6 * hour + 1) == old
    assert runner.submission_base(tmp_path, window_s=6 * hour) == landed  # 6 h before: in it
    assert runner.submission_base(tmp_path, window_s=7 * hour) == old
    assert runner.submission_base(tmp_path, window_s=7 * hour + 1) is None  # all of it is new
    assert runner.changed_files(landed, tmp_path) == {"a", "b"}
    (tmp_path / "c").write_text("not committed")
    assert runner.changed_files(landed, tmp_path) == {"a", "b", "c"}
    assert runner.changed_files(None, tmp_path) is None


def test_an_edit_is_touched_by_its_module_its_guarding_tests_or_its_entry() -> None:
    module = _named("module", file="pkg/m.py")
    guard = _named("guard", tests=("tests/test_x.py::t", "tests/test_g.py::t[1]"))
    entry = _named("entry")
    other = _named("other", file="pkg/o.py", tests=("tests/test_o.py",))
    everything = [module, guard, entry, other]
    chosen = runner.touched(everything, {"pkg/m.py", "tests/test_g.py", "docs/x.md"}, {"entry"})
    assert [m.name for m in chosen] == ["module", "guard", "entry"]
    assert runner.touched(everything, set(), set()) == []
    assert runner.touched(everything, None, set()) == everything  # no base: all are new


def test_an_entry_is_changed_when_new_or_its_text_differs(tmp_path: Path, monkeypatch: Any) -> None:
    entry = '[[mutation]]\nname = "{name}"\nfile = "a.py"\noriginal = "{original}"\n'
    folder = tmp_path / "tests" / "mutations"
    _git(tmp_path, "init", "-q", "-b", "main")
    base = _commit(tmp_path, 1_700_000_000, {"tests/mutations/t.toml": "\n".join(
        entry.format(name=n, original="x") for n in ("same", "edited"))})
    (folder / "t.toml").write_text("\n".join([entry.format(name="same", original="x"),
                                              entry.format(name="edited", original="z"),
                                              entry.format(name="new", original="x")]))
    (folder / "u.toml").write_text(entry.format(name="in-a-new-file", original="x"))
    monkeypatch.setattr(runner, "REPO", tmp_path)
    monkeypatch.setattr(runner, "MUTATIONS_DIR", folder)
    listed = [runner.Mutation(name=n, file="a.py", original="x", replacement="y", tests=("t",),
                              k=None, why="", timeout_s=1.0, source=s)
              for n, s in (("same", "t.toml"), ("edited", "t.toml"), ("new", "t.toml"),
                           ("in-a-new-file", "u.toml"))]
    assert runner.changed_entries(base, listed, tmp_path) == {"edited", "new", "in-a-new-file"}


def test_the_sample_moves_on_each_turn_and_covers_the_rest() -> None:
    everything = [_named(f"m{i:02d}") for i in range(10)]
    leave_out = {"m03", "m07"}
    turns = [[m.name for m in runner.rotating_sample(everything, leave_out, 3, turn)]
             for turn in range(3)]
    assert turns[0] == ["m00", "m01", "m02"]
    assert turns[1] == ["m04", "m05", "m06"]
    assert turns[2] == ["m08", "m09", "m00"]  # wraps
    assert not {name for turn in turns for name in turn} & leave_out
    assert {name for turn in turns for name in turn} == {f"m{i:02d}" for i in range(10)} - leave_out
    assert len(runner.rotating_sample(everything, set(), 50, 4)) == 10  # never an edit twice
    assert runner.rotating_sample(everything, set(), 0, 4) == []


def test_a_file_only_moved_is_not_touched_and_a_moved_and_edited_one_is(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The tests moved into their rooms (scripts/place_tests.py, git's R100) touch no edit, nor
    do the entries that name them at their new paths, nor a test whose code is the same but for
    comments, docstrings and the new module of a moved helper; a test moved and edited is
    changed at its new path, and so are the edits it guards (else CI would run the whole list
    after a move)."""
    body = "".join(f"def test_{i}() -> None:\n    assert {i} == {i}\n\n\n" for i in range(20))
    entry = ('[[mutation]]\nname = "{name}"\nfile = "pkg/{module}.py"\noriginal = "x"\n'
             'replacement = "z"\ntests = ["{test}::test_1"]\nwhy = "w"\n')

    def entries(prefix_a: str, prefix_b: str, original: str = "x") -> str:
        return "\n".join([entry.format(name="moved", module="m", test=f"{prefix_a}test_a.py"),
                          entry.format(name="edited", module="m", test=f"{prefix_b}test_b.py"),
                          entry.format(name="module-moved", module="n", test="tests/test_c.py"),
                          entry.format(name="text", module="m", test="tests/test_c.py")
                          .replace('"x"', f'"{original}"')])

    _git(tmp_path, "init", "-q", "-b", "main")
    base = _commit(tmp_path, 1_700_000_000, {
        "pkg/m.py": "x = 1\n" * 30, "pkg/n.py": "x = 2\n" * 30, "tests/test_a.py": body,
        "tests/test_b.py": body, "tests/test_c.py": '"""C."""\nfrom tests.test_a import test_1\n' + body,
        "tests/mutations/t.toml": entries("tests/", "tests/")})
    for folder in ("tests/room", "tests/other", "pkg/moved"):
        (tmp_path / folder).mkdir()
    _git(tmp_path, "mv", "tests/test_a.py", "tests/room/test_a.py")
    _git(tmp_path, "mv", "tests/test_b.py", "tests/other/test_b.py")
    (tmp_path / "tests/other/test_b.py").write_text(body.replace("assert 3 == 3", "assert 3 == 4"))
    _commit(tmp_path, 1_700_000_100, {"tests/mutations/t.toml": entries(
        "tests/room/", "tests/other/", original="y"),
        # a new docstring, a comment and the moved helper's new module: the same code
        "tests/test_c.py": '"""C, see tests/room/test_a.py."""\n'
                           "from tests.room.test_a import test_1  # moved\n" + body})
    _git(tmp_path, "mv", "pkg/n.py", "pkg/moved/n.py")  # in the working tree, not committed
    assert runner.changed_files(base, tmp_path) == {"tests/other/test_b.py", "tests/mutations/t.toml"}
    assert runner.moved_files(base, tmp_path) == {
        "tests/test_a.py": "tests/room/test_a.py", "tests/test_b.py": "tests/other/test_b.py",
        "pkg/n.py": "pkg/moved/n.py"}
    monkeypatch.setattr(runner, "REPO", tmp_path)
    monkeypatch.setattr(runner, "MUTATIONS_DIR", tmp_path / "tests" / "mutations")
    listed = runner.load(tmp_path / "tests" / "mutations")
    assert runner.changed_entries(base, listed, tmp_path) == {"text"}
    chosen = runner.touched(listed, runner.changed_files(base, tmp_path),
                            runner.changed_entries(base, listed, tmp_path))
    assert [m.name for m in chosen] == ["edited", "text"]
