"""The package's layout keeps its rules (docs/DESIGN.md §3.2): no import circle between
modules, and a package's face (its ``__init__`` with ``__all__``) is its only door; an
``hpo.*`` key that several modules use is named once, in keys.py (§2.3).

Read from the source with ``ast``, nothing imported: every import counts, at module level or
inside a function (a deferred import still ties the two modules together), and so does one
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpo_orchestrator

ROOT = Path(hpo_orchestrator.__file__).parent


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def _imported(name: str, path: Path, is_init: bool, modules: dict[str, tuple[Path, bool]],
              ) -> Iterator[tuple[str, int]]:
    """The project's modules that ``name`` imports, with the line: ``from P import x`` is an
    import of ``P.x`` where that is a module, else of ``P``."""
    package = name if is_init else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                yield target, node.lineno


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: the line of the first such import}."""
    modules = _modules(root)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_init) in modules.items():
        edges = graph.setdefault(name, {})
        for target, line in _imported(name, path, is_init, modules):
            edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative: the graph is small, but recursion depth should not depend on it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def private_reaches(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports of a private module ``P._x`` (or anything below it) from outside package P."""
    reaches = []
    for importer, targets in sorted(graph.items()):
        for target, line in sorted(targets.items()):
            parts = target.split(".")
            for depth, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:depth])
                    if importer != owner and not importer.startswith(owner + "."):
                        reaches.append(f"{importer} (line {line}) imports {target}: "
                                       f"re-export what it needs from {owner.replace('.', '/')}/__init__.py")
                    break
    return reaches


def test_no_import_circle() -> None:
    found = cycles(import_graph(ROOT))
    assert not found, "import circles (each a set of modules that import one another):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_no_room_reaches_back() -> None:
    """The rooms (the top-level packages and modules) import one another in one direction only
    (docs/DESIGN.md §3.2: the data flow's order), so none is a circle even through others."""
    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, dict[str, int]] = {}
    for importer, targets in import_graph(ROOT).items():
        edges = rooms.setdefault(room(importer), {})
        for target, line in targets.items():
            if room(target) != room(importer):
                edges.setdefault(room(target), line)
    for target in [t for edges in rooms.values() for t in edges]:
        rooms.setdefault(target, {})
    found = cycles(rooms)
    assert not found, "rooms that reach back:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_package_is_entered_through_its_face() -> None:
    found = private_reaches(import_graph(ROOT))
    assert not found, "\n".join(found)


_KEY = re.compile(r"hpo(\.[a-z0-9_]+)+\.?")


def test_a_key_used_by_several_modules_is_named_once() -> None:
    """A string that is a whole ``hpo.*`` key (or a key's prefix), outside keys.py: SQL text,
    which holds keys inside longer strings, is not one; the built-in objectives set keys by name
    as a user's objective does."""
    from hpo_orchestrator import keys

    named = {getattr(keys, name) for name in keys.__all__}
    where: dict[str, set[str]] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "keys.py" or relative.startswith("objectives/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and _KEY.fullmatch(node.value):
                where[node.value].add(relative)
    spelt = {key: sorted(files) for key, files in where.items() if key in named or len(files) > 1}
    assert not spelt, f"use (or add) the constant in hpo_orchestrator/keys.py: {spelt}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small package with the two faults the checks look for."""
    root = tmp_path / "pkg"
    for folder in (root, root / "a", root / "b"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (root / "a" / "_one.py").write_text("from pkg.b import _two\n")
    (root / "b" / "_two.py").write_text("def f():\n    from pkg.a._one import g\n")
    (root / "a" / "_three.py").write_text("from . import _one\nfrom pkg.a import _one as again\n")
    return root


def test_the_checks_see_a_circle_and_a_private_reach(tree: Path) -> None:
    graph = import_graph(tree)
    assert graph["pkg.a._three"] == {"pkg.a._one": 1}  # relative and absolute: one module, inside
    assert cycles(graph) == [["pkg.a._one", "pkg.b._two"]]  # a deferred import counts
    assert [r.split(" (")[0] for r in private_reaches(graph)] == ["pkg.a._one", "pkg.b._two"]
