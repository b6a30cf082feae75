"""Tests are laid out as the package is (docs/DESIGN.md §3.6): each test file sits in the folder
of the room it tests, as scripts/place_tests.py's rule says, so a module's tests are found by
its path. A file added flat (another branch merged), or left behind when its module moved to
another room, fails here with the folder it belongs in and the command that moves it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def _place_tests() -> ModuleType:
    spec = importlib.util.spec_from_file_location("place_tests", REPO / "scripts" / "place_tests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


place = _place_tests()
NAMES = place.Names.of(REPO)


def test_every_test_file_sits_where_the_rule_puts_it() -> None:
    found = place.plan(REPO)
    assert not found.unplaced, "\n".join(found.unplaced)
    assert not found.moves, (
        "test files out of place (python scripts/place_tests.py --apply moves them and fixes "
        "the references):\n" + "\n".join(f"  {old} belongs in {new}" for old, new in found.moves))
    assert not list((REPO / "tests").glob("test_*.py"))  # none flat: every one has a room


def test_each_folder_of_tests_is_a_package() -> None:
    """Two test files of one name in two rooms would collide under pytest's default import
    mode (both `test_x`); as packages they are `tests.a.test_x` and `tests.b.test_x`."""
    folders = {path.parent for path in (REPO / "tests").rglob("test_*.py")}
    assert folders and all((folder / "__init__.py").is_file() for folder in folders), sorted(
        str(folder.relative_to(REPO)) for folder in folders if not (folder / "__init__.py").is_file())


def test_no_module_of_tests_has_a_folder_s_name() -> None:
    """A folder shadows the module of its name: tests/objectives.py (the test objectives
    studies import as tests.objectives:NAME) is the objectives folder's __init__.py."""
    tests = REPO / "tests"
    shadowed = [p.name for p in tests.glob("*.py") if (tests / p.stem).is_dir()]
    assert not shadowed, f"move each into its folder as __init__.py: {shadowed}"
    assert "def quadratic(" in (tests / "objectives" / "__init__.py").read_text()


def test_each_folder_is_a_room_of_the_package_or_one_of_the_named_others() -> None:
    folders = {path.parent.name for path in (REPO / "tests").rglob("test_*.py")}
    assert folders <= NAMES.rooms | set(place.EXTRA_FOLDERS), folders - NAMES.rooms


def test_the_table_names_existing_tests_and_only_those_the_names_would_not_place() -> None:
    """PLACES stays the short list of exceptions: a line for a file that is gone, or for one
    whose name already places it in the same folder, is dead weight."""
    existing = {path.stem.removeprefix("test_") for path in (REPO / "tests").rglob("test_*.py")}
    assert set(place.PLACES) <= existing, sorted(set(place.PLACES) - existing)
    assert set(place.PLACES.values()) <= NAMES.rooms | set(place.EXTRA_FOLDERS)
    redundant = []
    for stem, folder in place.PLACES.items():
        without = dict(place.PLACES)
        del without[stem]
        try:
            derived = _derived(f"test_{stem}.py", without)
        except place.Unplaced:
            continue
        if derived == folder:
            redundant.append(stem)
    assert not redundant, f"placed by their names already: {redundant}"


def _derived(name: str, table: dict[str, str]) -> str:
    saved = dict(place.PLACES)
    place.PLACES.clear()
    place.PLACES.update(table)
    try:
        return str(place.folder_for(name, NAMES))
    finally:
        place.PLACES.clear()
        place.PLACES.update(saved)


@pytest.mark.parametrize(("name", "folder"), [
    ("test_packer_groups.py", "placement"),  # placement/_packer.py: a module's room
    ("test_report_units.py", "report"),  # a room by its name
    ("test_config_cache.py", "config"),  # the room, before config/_cache.py
    ("test_runner_threads.py", "runner"),  # a top-level module: a room of its own
    ("test_sim_packing_cases.py", "scripts"),  # scripts/sim_packing.py
    ("test_full_disk.py", "scheduler"),  # a promise: PLACES
])
def test_the_rule_places_a_new_file_by_its_name(name: str, folder: str) -> None:
    assert place.folder_for(name, NAMES) == folder


def test_a_file_the_rule_cannot_place_says_where_its_imports_point() -> None:
    source = ("from hpo_orchestrator.status import collect\nfrom hpo_orchestrator.errors import X\n"
              "from hpo_orchestrator.status._model import A, B\nfrom hpo_orchestrator.db import c\n")
    with pytest.raises(place.Unplaced, match=r"tests/status/ -- name it after the module"):
        place.folder_for("test_zebra_crossing.py", NAMES, source)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout


def test_a_flat_file_from_a_merge_is_moved_with_its_history_and_references(tmp_path: Path) -> None:
    """What the lead runs after merging a branch: the flat file fails the check, --apply moves
    it with `git mv` into a new folder that is a package, and the paths and module names that
    named it (an entry of the mutation list, another test's import) follow it."""
    files = {
        "hpo_orchestrator/placement/__init__.py": "", "hpo_orchestrator/placement/_packer.py": "",
        "scripts/sim.py": "", "tests/__init__.py": "",
        "tests/test_packer_new.py": "def helper() -> int:\n    return 1\n" * 20,
        "tests/mutations/m.toml": 'tests = ["tests/test_packer_new.py::test_x"]\n',
        "tests/placement.py": "NAMED = 1\n", "docs/x.md": "see tests/placement.py\n",
        "tests/e2e/__init__.py": "",
        "tests/e2e/test_multi.py": "from tests.test_packer_new import helper\n"
                                   "from tests.test_packer_newer import kept\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "merged")
    found = place.plan(tmp_path)
    assert found.moves == [("tests/test_packer_new.py", "tests/placement/test_packer_new.py")]
    assert found.unplaced == []
    place.apply(found.moves, tmp_path)
    assert "R  tests/test_packer_new.py -> tests/placement/test_packer_new.py" in _git(
        tmp_path, "status", "--short")
    # the helper of the folder's name is its __init__, as the module it was
    assert (tmp_path / "tests/placement/__init__.py").read_text() == "NAMED = 1\n"
    assert not (tmp_path / "tests/placement.py").exists()
    assert (tmp_path / "docs/x.md").read_text() == "see tests/placement/__init__.py\n"
    assert (tmp_path / "tests/mutations/m.toml").read_text() == \
        'tests = ["tests/placement/test_packer_new.py::test_x"]\n'
    assert (tmp_path / "tests/e2e/test_multi.py").read_text() == (
        "from tests.placement.test_packer_new import helper\n"
        "from tests.test_packer_newer import kept\n")  # another name that starts the same: kept
    assert place.plan(tmp_path).moves == []
