"""docs/DESIGN.md §3.2 is the package's map: its module table names every module once, and its
table of rooms says which rooms each imports. Both are checked against the source (the
imports as tests/repo/test_layout.py reads them: every import, deferred or under TYPE_CHECKING)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.repo.test_layout import ROOT, import_graph

DESIGN = ROOT.parent / "docs" / "DESIGN.md"
FLOOR = {"errors", "keys"}  # any room may import them (the map says so)
_TICKED = re.compile(r"`([^`]+)`")


def _section(text: str) -> str:
    start = text.index("### 3.2 Modules")
    return text[start:text.index("\n### ", start + 1)]


def _table(section: str, header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the markdown table whose header row starts ``header``."""
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def named_modules(section: str) -> list[str]:
    """The modules the map's module column names, as paths under the package: a ticked
    ``folder/_x.py`` sets the folder, a bare ``_x.py`` after it is in that folder; a ``;``
    starts again at the top of the package."""
    named = []
    for row in _table(section, "| stage | module |"):
        for part in row[1].split(";"):
            folder = ""
            for token in _TICKED.findall(part):
                if not token.endswith(".py"):
                    continue
                if "/" in token:
                    folder, _, token = token.rpartition("/")
                    folder += "/"
                named.append(folder + token)
    return named


def package_modules(root: Path) -> set[str]:
    """Every module of the package but the faces (``__init__.py``)."""
    return {path.relative_to(root).as_posix() for path in root.rglob("*.py")
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def documented_arrows(section: str) -> dict[str, set[str]]:
    return {_TICKED.findall(room)[0]: set(_TICKED.findall(imports))
            for room, imports in _table(section, "| room | imports |")}


def room_arrows(root: Path) -> dict[str, set[str]]:
    """Room -> the rooms it imports, the floor left out: a room is a top-level package or
    module, the package's face itself is ``hpo_orchestrator``."""
    def room(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    arrows: dict[str, set[str]] = {}
    for importer, targets in import_graph(root).items():
        if room(importer) in FLOOR:
            continue
        found = arrows.setdefault(room(importer), set())
        found |= {room(t) for t in targets if room(t) != room(importer) and room(t) not in FLOOR}
    return arrows


def test_the_map_names_every_module_once() -> None:
    named = named_modules(_section(DESIGN.read_text()))
    twice = sorted({m for m in named if named.count(m) > 1})
    assert not twice, f"named twice in docs/DESIGN.md §3.2: {twice}"
    have = package_modules(ROOT)
    assert not have - set(named), f"missing from docs/DESIGN.md §3.2's map: {sorted(have - set(named))}"
    assert not set(named) - have, f"named in docs/DESIGN.md §3.2, not in the package: " \
        f"{sorted(set(named) - have)}"


def test_the_map_says_which_rooms_each_room_imports() -> None:
    documented = documented_arrows(_section(DESIGN.read_text()))
    actual = room_arrows(ROOT)
    wrong = {room: {"imports, not in the map": sorted(actual.get(room, set()) - said),
                    "in the map, not imported": sorted(said - actual.get(room, set()))}
             for room, said in documented.items() if said != actual.get(room, set())}
    wrong |= {room: {"a room the map leaves out": sorted(targets)}
              for room, targets in actual.items() if room not in documented}
    assert not wrong, f"docs/DESIGN.md §3.2's rooms table and the imports differ: {wrong}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A package of two rooms, ``a`` importing ``b``, and the floor."""
    root = tmp_path / "pkg"
    for folder in (root, root / "a", root / "b"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (root / "errors.py").write_text("")
    (root / "a" / "_one.py").write_text("from pkg.b import _two\nfrom pkg import errors\n")
    (root / "b" / "_two.py").write_text("")
    (root / "b" / "_three.py").write_text("from pkg import errors\n")
    return root


def test_the_checks_read_a_map_and_its_imports(tree: Path) -> None:
    section = """### 3.2 Modules

| stage | module | owns |
|---|---|---|
| a | `a/_one.py` (and `a/`) | it |
| b | `b/_two.py`, `_three.py`; `errors.py` | them |

| room | imports |
|---|---|
| `a` | `b` |
| `b` | — |
"""
    assert named_modules(section) == ["a/_one.py", "b/_two.py", "b/_three.py", "errors.py"]
    assert package_modules(tree) == {"a/_one.py", "b/_two.py", "b/_three.py", "errors.py"}
    assert documented_arrows(section) == {"a": {"b"}, "b": set()}
    assert room_arrows(tree) == {"pkg": set(), "a": {"b"}, "b": set()}
