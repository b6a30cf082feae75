"""Where each test file belongs (docs/DESIGN.md §3.6), and the moves that put it there.

    python scripts/place_tests.py            # print the moves (`git mv OLD NEW`); exit 1 if any
    python scripts/place_tests.py --apply    # make them, and fix every reference to the old paths

Tests are laid out as the package is: ``tests/<room>/test_*.py``, one folder per room of the
package, so a module's tests are found by its path. The rule, in order:

1. ``PLACES`` below, by the file's name: the tests named after a promise rather than a
   module (``test_full_disk.py``), those of the repository itself (``repo/``: its layout, its
   docs, the install, the README) and those of the whole program across rooms (``e2e/``).
2. Else the longest ``_``-joined start of the name after ``test_`` that names a room of the
   package (its folder: ``test_report_units.py`` -> ``report/``), a module of the package (its
   room: ``test_packer_groups.py`` -> ``placement/``, as placement/_packer.py; a top-level
   module is a room of its own: ``test_runner.py`` -> ``runner/``) or a script of scripts/
   (``scripts/``); at one length a room wins over a module, a module over a script.
3. Else the file has no place: name it after the module it tests, or add it to ``PLACES``
   (the message suggests the room it imports most from).

``--apply`` is what to run after merging a branch that added flat test files (or renamed a
module): each move is a ``git mv`` (history kept), a new folder gets its ``__init__.py``
(the folders are packages, so two files of one name in two folders do not collide; a helper
module of the folder's name, as tests/objectives.py was, becomes that ``__init__.py``), and
every tracked text file's ``tests/OLD.py`` and ``tests.OLD`` become the new path and module
(the mutation list, the docs, the Makefile, imports between tests). tests/repo/
test_tests_layout.py fails while a file is out of place, naming where it belongs.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# By file name (without test_ and .py): tests that step 2 would not place, or would place in
# the wrong room. Kept short: a test named after its module needs no line here.
PLACES: dict[str, str] = {
    # the repository: its layout and docs, what it installs, its scripts' tests
    "layout": "repo",  # the package's layout rules (not placement/_layout.py)
    "design_doc": "repo",
    "design_map": "repo",
    "imports": "repo",
    "install": "repo",
    "readme": "repo",
    "quality_docs": "repo",
    "tests_layout": "repo",  # this rule
    "mutations": "scripts",  # scripts/mutation.py
    "bench_common_start": "scripts",  # scripts/bench_quality.py and scripts/benchmarking/
    "bench_ray": "scripts",
    "bench_records": "scripts",
    "cnn_retrain": "scripts",
    # the whole program: one promise kept by the run, status and report together
    "features": "e2e",
    "multi": "e2e",
    "multi_objective": "e2e",
    "orchestrator": "e2e",  # whole studies (not scheduler/orchestrator.py alone)
    "postgres": "e2e",
    "read_only_storage": "e2e",
    "secrets": "e2e",
    "sql_durations": "e2e",  # the README's SQL after Ctrl-C and kill -9 of real runs
    # promises, each kept by one room
    "busy_gpu_notes": "placement",
    "default_parallel": "placement",  # scheduler.parallel, decoded in placement/_settings.py
    "packed_early": "placement",  # placement/_rules.py cpu_room, through a whole run
    "delete_study": "db",  # db/tables.py
    "retrying": "db",  # db/_retry.py
    "first_decision": "scheduler",
    "full_disk": "scheduler",
    "heartbeat_lock": "scheduler",  # scheduler/_recovery.py
    "log_cap": "scheduler",  # scheduler/_logs.py
    "outside_trials": "scheduler",
    "reliability_children": "scheduler",
    "reliability_storage": "scheduler",
    "reuse": "scheduler",  # scheduler/_workers.py
    "run_folders": "scheduler",  # scheduler/_logs.py (not cli/_run.py)
    "signals": "scheduler",  # scheduler/_stopping.py
    "spares": "scheduler",
    "space_change": "config",  # config/_space.py: a built-in objective's space
    "custom_space_change": "study",  # study/_space.py: a custom objective's space
    "scale": "study",  # study/_mirror.py
    "sampler_defaults": "study",  # study/_setup.py (not telemetry/_sampler.py)
    "trial_end": "study",  # study/_end.py (not scheduler/_trial.py)
    "import_first": "worker",  # worker/_env.py
    "integration_callbacks": "worker",  # the trial proxy
    "objective_leftovers": "worker",
    "trial_reads": "worker",  # worker/_proxy.py (not scheduler/_trial.py)
    "objective_data_once": "objectives",
    "reports_best_so_far": "objectives",  # not cli/_reports.py
    "pasted_commands": "cli",
    "suggested_commands": "cli",
    "pruner_registry": "pruning",
    "pruner_tuning": "pruning",
    "trust": "status",
}
# Folders that are no room of the package.
EXTRA_FOLDERS = {"repo": "the repository", "scripts": "scripts/", "e2e": "the whole program"}


class Unplaced(ValueError):
    """A test file the rule gives no folder."""


@dataclass(frozen=True)
class Names:
    """What step 2 matches a test's name against: name -> {(folder, rank)}, rank 0 a room,
    1 a module of the package, 2 a script."""

    by_name: dict[str, frozenset[tuple[str, int]]]
    rooms: frozenset[str]

    @classmethod
    def of(cls, repo: Path = REPO) -> Names:
        found: dict[str, set[tuple[str, int]]] = {}

        def add(name: str, folder: str, rank: int) -> None:
            found.setdefault(name.lstrip("_"), set()).add((folder, rank))

        package = repo / "hpo_orchestrator"
        rooms = set()
        for entry in sorted(package.iterdir()):
            if entry.is_dir() and (entry / "__init__.py").is_file():
                rooms.add(entry.name)
                add(entry.name, entry.name, 0)
                for module in entry.rglob("*.py"):
                    if not module.stem.startswith("__"):
                        add(module.stem, entry.name, 1)
            elif entry.suffix == ".py" and not entry.stem.startswith("__"):
                room = entry.stem.lstrip("_")  # a top-level module: a room of its own
                rooms.add(room)
                add(entry.stem, room, 0)
        for script in sorted((repo / "scripts").iterdir()):
            if script.suffix == ".py" or (script / "__init__.py").is_file():
                add(script.stem, "scripts", 2)
        return cls({k: frozenset(v) for k, v in found.items()}, frozenset(rooms))


def folder_for(test_name: str, names: Names, source: str | None = None) -> str:
    """The folder under tests/ where the file ``test_name`` (``test_x.py``) belongs."""
    stem = test_name.removesuffix(".py").removeprefix("test_")
    if stem in PLACES:
        return PLACES[stem]
    words = stem.split("_")
    for length in range(len(words), 0, -1):
        matches = names.by_name.get("_".join(words[:length]))
        if matches:
            best = min(rank for _, rank in matches)
            folders = sorted({folder for folder, rank in matches if rank == best})
            if len(folders) == 1:
                return folders[0]
            raise Unplaced(f"'{'_'.join(words[:length])}' names modules of "
                           f"{', '.join(folders)}; add the file to PLACES in scripts/place_tests.py")
    hint = suggest(source, names) if source is not None else None
    raise Unplaced(
        "no room, module or script is named by the start of its name"
        + (f"; it imports most from {hint}: it belongs in tests/{hint}/" if hint else "")
        + " -- name it after the module it tests, or add it to PLACES in scripts/place_tests.py")


def suggest(source: str, names: Names) -> str | None:
    """The room a test imports most names from (errors, keys and testing left out)."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        parts = node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.ImportFrom) and parts[:1] == ["hpo_orchestrator"]:
            rooms = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
            for room in rooms:
                counts[room.lstrip("_")] = counts.get(room.lstrip("_"), 0) + len(node.names)
    counts = {r: n for r, n in counts.items() if r in names.rooms and r not in {"errors", "keys", "testing"}}
    return max(sorted(counts), key=lambda r: counts[r]) if counts else None


@dataclass(frozen=True)
class Plan:
    moves: list[tuple[str, str]]  # (old, new), relative to the repository
    unplaced: list[str]  # why each file without a place has none


def plan(repo: Path = REPO) -> Plan:
    names = Names.of(repo)
    tests = repo / "tests"
    moves, unplaced = [], []
    for path in sorted(tests.rglob("test_*.py")):
        relative = path.relative_to(repo).as_posix()
        try:
            folder = folder_for(path.name, names, path.read_text())
        except Unplaced as exc:
            unplaced.append(f"tests/{path.relative_to(tests).as_posix()}: {exc}")
            continue
        target = f"tests/{folder}/{path.name}"
        if relative != target:
            moves.append((relative, target))
    return Plan(moves, unplaced)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def apply(moves: list[tuple[str, str]], repo: Path = REPO) -> list[str]:
    """``git mv`` each file, give each new folder an ``__init__.py``, and rewrite the old
    paths and module names in every tracked text file; the files rewritten."""
    patterns = []
    for old, new in moves:
        folder = (repo / new).parent
        if not folder.is_dir():
            folder.mkdir(parents=True)
        init = folder / "__init__.py"
        helper = folder.with_suffix(".py")
        if not init.exists() and helper.is_file():
            # A helper module of the room's name (tests/objectives.py was: the test objectives
            # studies import as tests.objectives:NAME) becomes the folder's __init__: the same
            # module name, which the folder would otherwise shadow.
            _git(repo, "mv", helper.relative_to(repo).as_posix(), init.relative_to(repo).as_posix())
            patterns.append((re.compile(rf"(?<![\w.]){re.escape(helper.relative_to(repo).as_posix())}"),
                             init.relative_to(repo).as_posix()))
        elif not init.exists():
            init.write_text("")
            _git(repo, "add", init.relative_to(repo).as_posix())
        _git(repo, "mv", old, new)
    for old, new in moves:
        patterns.append((re.compile(rf"(?<![\w.]){re.escape(old)}"), new))
        old_module, new_module = (p.removesuffix(".py").replace("/", ".") for p in (old, new))
        patterns.append((re.compile(rf"(?<![\w.]){re.escape(old_module)}(?!\w)"), new_module))
    rewritten = []
    for name in _git(repo, "ls-files", "-z").split("\0"):
        path = repo / name
        if not name or path.is_symlink() or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        new_text = text
        for pattern, replacement in patterns:
            new_text = pattern.sub(replacement, new_text)
        if new_text != text:
            path.write_text(new_text)
            rewritten.append(name)
    return rewritten


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apply", action="store_true",
                        help="make the moves (git mv) and fix the references to the old paths")
    args = parser.parse_args(argv)
    found = plan()
    for line in found.unplaced:
        print(f"error: {line}", file=sys.stderr)
    if found.unplaced:
        print("hint: docs/DESIGN.md §3.6 has the rule; nothing was moved", file=sys.stderr)
        return 2
    if not found.moves:
        print("every test file is where it belongs")
        return 0
    for old, new in found.moves:
        print(f"git mv {old} {new}")
    if not args.apply:
        print(f"{len(found.moves)} to move: --apply moves them")
        return 1
    rewritten = apply(found.moves)
    print(f"moved {len(found.moves)}; references fixed in {len(rewritten)} files: "
          f"{' '.join(rewritten)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
