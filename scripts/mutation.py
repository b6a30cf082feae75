"""Mutation testing of the guarding tests: `make mutation`.

Each mutation (tests/mutations/*.toml) is a small named edit of production code: an exact
snippet, its replacement, and the tests that must catch it. One at a time, in a scratch copy
of the working tree (never the checkout), the snippet is replaced and the guarding tests run
with the project's .venv. Results:

- killed: a guarding test failed (or the tests hung past the mutation's timeout);
- survived: every guarding test passed with the code broken: the tests do not guard it;
- error: the snippet is not in the file exactly once (the code moved: update the entry), a
  guarding test was skipped or not found, or pytest itself failed.

Before the mutations, the guarding tests run once on the unmutated copy: a test that fails
there would "kill" every mutation and prove nothing. Exit status 0 only when every mutation
was killed.

``--touched`` and ``--sample N`` (what CI runs, docs/MUTATION.md "In CI") choose a part of the
list: the edits the submission touched (their module, a guarding test's file or the entry
itself changed since the last landed commit, read from git; a file only moved, or whose
code differs only in comments and docstrings, is not changed) and N more, a window of the
list that moves on with every commit.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTATIONS_DIR = REPO / "tests" / "mutations"
PYTHON = REPO / ".venv" / "bin" / "python"
DEFAULT_TIMEOUT_S = 420.0
# CI runs in a fresh clone of the submitted main, where no branch or tag marks the last landed
# commit. A session writes it into LANDED_FILE when it starts; without that file (or with a
# commit that is not HEAD's ancestor) the newest commit of main's first-parent line this much
# older than HEAD stands for it.
SUBMISSION_WINDOW_S = 3 * 3600
LANDED_FILE = Path(".ci") / "landed"
_LIVE: set[subprocess.Popen[str]] = set()  # pytest runs in flight: stopped if we are
_FIELDS = {"name", "file", "original", "replacement", "tests", "k", "why", "timeout_s"}


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    original: str  # must occur exactly once in the file
    replacement: str
    tests: tuple[str, ...]  # pytest node ids or paths
    k: str | None  # an optional -k expression narrowing them
    why: str
    timeout_s: float
    source: str  # the .toml file it was read from

    def pytest_args(self) -> list[str]:
        return [*self.tests, *(["-k", self.k] if self.k else [])]


@dataclass(frozen=True)
class Result:
    mutation: Mutation
    outcome: str  # killed / survived / error
    detail: str
    seconds: float


def load(folder: Path = MUTATIONS_DIR) -> list[Mutation]:
    """Every mutation of every .toml file in ``folder``; a malformed entry is a ValueError."""
    mutations: list[Mutation] = []
    for path in sorted(folder.glob("*.toml")):
        entries = tomllib.loads(path.read_text()).get("mutation", [])
        for entry in entries:
            where = f"{path.name}: {entry.get('name', '<unnamed>')}"
            missing = {"name", "file", "original", "replacement", "tests", "why"} - set(entry)
            unknown = set(entry) - _FIELDS
            if missing or unknown:
                raise ValueError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
            if entry["original"] == entry["replacement"]:
                raise ValueError(f"{where}: the replacement equals the original")
            if not entry["tests"]:
                raise ValueError(f"{where}: no guarding tests")
            mutations.append(Mutation(
                name=entry["name"], file=entry["file"], original=entry["original"],
                replacement=entry["replacement"], tests=tuple(entry["tests"]), k=entry.get("k"),
                why=" ".join(entry["why"].split()), source=path.name,
                timeout_s=float(entry.get("timeout_s", DEFAULT_TIMEOUT_S))))
    names = [m.name for m in mutations]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"mutation names used twice: {', '.join(duplicates)}")
    return mutations


def _git(*args: str, repo: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def submission_base(repo: Path = REPO, window_s: float = SUBMISSION_WINDOW_S) -> str | None:
    """The last landed commit: the one LANDED_FILE names, where it is an ancestor of HEAD
    (a session longer than the window would otherwise leave its first commits out); else the
    newest commit on HEAD's first-parent line committed ``window_s`` or more before HEAD;
    None when there is none (the whole history is new)."""
    landed = repo / LANDED_FILE
    if landed.is_file():
        named = (landed.read_text().split() or [""])[0]
        known = subprocess.run(["git", "merge-base", "--is-ancestor", named, "HEAD"], cwd=repo,
                               capture_output=True)
        if named and known.returncode == 0:
            return _git("rev-parse", named, repo=repo)
    head_time = int(_git("log", "-1", "--format=%ct", "HEAD", repo=repo))
    base = _git("rev-list", "--first-parent", "-1", f"--before={head_time - int(window_s)}",
                "HEAD", repo=repo)
    return base or None


def _name_status(*revs: str, repo: Path) -> list[list[str]]:
    """``git diff --name-status --find-renames`` between ``revs``: one field list a file."""
    shown = _git("diff", "--name-status", "--find-renames", *revs, repo=repo)
    return [line.split("\t") for line in shown.splitlines() if line]


def _changes(base: str, repo: Path) -> tuple[set[str], dict[str, str]]:
    """(files changed since ``base``, files moved: old path -> new path). A file moved as it
    was (git's rename score R100) has not changed: the lead's move of the tests into their
    rooms (scripts/place_tests.py) touches no edit. Moved and edited (R<100): its new path
    changed. The committed changes, then the working tree's on top of them."""
    changed: set[str] = set()
    moved: dict[str, str] = {}
    for revs in ((base, "HEAD"), ("HEAD",)):
        for fields in _name_status(*revs, repo=repo):
            status, paths = fields[0], fields[1:]
            if status.startswith("R"):
                old, new = paths
                for before, after in list(moved.items()):  # moved in a commit, then again
                    if after == old:
                        moved[before] = new
                moved.setdefault(old, new)
                if old in changed:  # edited in a commit, moved in the working tree
                    changed.discard(old)
                    changed.add(new)
                elif status != "R100":
                    changed.add(new)
            else:  # A, M, D, T, and C's copy
                changed.add(paths[-1])
    return changed, moved


def _code(text: str) -> str | None:
    """A Python file's code without its comments and docstrings (None: not Python that
    parses): what a mutation's verdict can depend on."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _same_code(base: str, old: str, new: str, moved: dict[str, str], repo: Path) -> bool:
    """Whether the Python file ``new`` holds the code ``old`` held at ``base``, the modules
    moved since read under their new names (a docstring or a comment naming a moved test's new
    path, or an import of a moved test's helper from its new module, changes no verdict)."""
    if not new.endswith(".py") or not (repo / new).is_file():
        return False
    shown = subprocess.run(["git", "show", f"{base}:{old}"], cwd=repo, capture_output=True, text=True)
    if shown.returncode != 0:
        return False
    text = shown.stdout
    for was, now in moved.items():
        if was.endswith(".py") and now.endswith(".py"):
            was_module, now_module = (p.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                                      for p in (was, now))
            text = re.sub(rf"(?<![\w.]){re.escape(was_module)}(?!\w)", now_module, text)
    before = _code(text)
    return before is not None and before == _code((repo / new).read_text())


def changed_files(base: str | None, repo: Path = REPO) -> set[str] | None:
    """Files changed since ``base``: in its commits up to HEAD (merged branches too) and in the
    working tree (edited, staged or untracked); a file only moved is not one of them
    (``_changes``), nor is a Python file whose code is the same but for comments, docstrings
    and the new names of moved modules. None: no base, every file is new."""
    if base is None:
        return None
    changed, moved = _changes(base, repo)
    came_from = {new: old for old, new in moved.items()}
    changed = {name for name in changed
               if not _same_code(base, came_from.get(name, name), name, moved, repo)}
    changed |= set(_git("ls-files", "--others", "--exclude-standard", repo=repo).splitlines())
    return set(filter(None, changed))


def moved_files(base: str, repo: Path = REPO) -> dict[str, str]:
    """The files moved since ``base`` (edited or not): old path -> new path."""
    return _changes(base, repo)[1]


def _renamed(entry: dict[str, object], moved: dict[str, str]) -> dict[str, object]:
    """An entry as it reads with the files it names at their new paths."""
    renamed = dict(entry)
    if isinstance(entry.get("file"), str):
        renamed["file"] = moved.get(str(entry["file"]), entry["file"])
    tests = entry.get("tests")
    if isinstance(tests, list):
        renamed["tests"] = [moved.get(t.partition("::")[0], t.partition("::")[0])
                            + "".join(t.partition("::")[1:]) if isinstance(t, str) else t
                            for t in tests]
    return renamed


def changed_entries(base: str, mutations: list[Mutation], repo: Path = REPO) -> set[str]:
    """Names of the entries that are new since ``base`` or whose text differs from it, an
    entry whose only change is the new path of a file moved since (its module, a guarding
    test's file) left out: the move is not an edit of it."""
    moved = moved_files(base, repo)
    before: dict[str, dict[str, object]] = {}
    for source in sorted({m.source for m in mutations}):
        relative = (MUTATIONS_DIR / source).relative_to(REPO).as_posix()
        shown = subprocess.run(["git", "show", f"{base}:{relative}"], cwd=repo,
                               capture_output=True, text=True)
        if shown.returncode == 0:  # else the file is new: each of its entries too
            for entry in tomllib.loads(shown.stdout).get("mutation", []):
                before[entry.get("name", "")] = _renamed(entry, moved)
    now = {entry["name"]: entry for source in sorted({m.source for m in mutations})
           for entry in tomllib.loads((MUTATIONS_DIR / source).read_text()).get("mutation", [])}
    return {name for name, entry in now.items()
            if name not in before or before[name] != _renamed(entry, moved)}


def touched(mutations: list[Mutation], files: set[str] | None,
            entries: set[str]) -> list[Mutation]:
    """The edits a change touched: their module, a guarding test's file or the entry itself
    changed (``files`` None: everything changed)."""
    if files is None:
        return list(mutations)
    return [m for m in mutations if m.file in files or m.name in entries
            or any(test.split("::")[0] in files for test in m.tests)]


def rotating_sample(mutations: list[Mutation], leave_out: set[str], size: int,
                    turn: int) -> list[Mutation]:
    """``size`` edits of those not in ``leave_out``, in name order: the window that starts
    ``turn * size`` edits on (wrapping), so that consecutive turns cover the whole list."""
    rest = sorted((m for m in mutations if m.name not in leave_out), key=lambda m: m.name)
    if size <= 0 or not rest:
        return []
    start = turn * size % len(rest)
    return [rest[(start + i) % len(rest)] for i in range(min(size, len(rest)))]


def choose(mutations: list[Mutation], *, since: str | None, use_touched: bool, sample: int,
           repo: Path = REPO) -> tuple[list[Mutation], str]:
    """The edits ``--touched``/``--sample`` select, in the list's order, and a line saying why."""
    base = since or submission_base(repo)
    files = changed_files(base, repo)
    entries = changed_entries(base, mutations, repo) if base and files is not None else set()
    chosen = touched(mutations, files, entries) if use_touched else []
    turn = int(_git("rev-list", "--count", "--first-parent", "HEAD", repo=repo))
    extra = rotating_sample(mutations, {m.name for m in chosen}, sample, turn)
    names = {m.name for m in chosen} | {m.name for m in extra}
    where = f"since {base[:12]}" if base else "no earlier commit: all of them"
    why = (f"{len(chosen)} touched ({where}) and {len(extra)} of the rest (sample turn {turn}) "
           f"of {len(mutations)} mutations")
    return [m for m in mutations if m.name in names], why


def make_scratch(parent: Path, index: int) -> Path:
    """A copy of the working tree as git sees it (tracked and untracked files, not ignored
    ones: no .venv, no caches, no __pycache__ whose stale bytecode could hide an edit)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, check=True, capture_output=True).stdout.decode()
    scratch = parent / f"tree-{index}"
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # e.g. hpo_orchestrator/conf -> ../conf: a link again
            target.symlink_to(os.readlink(source))
        elif source.is_file():  # a tracked file deleted in the working tree is left out
            shutil.copy2(source, target)
    return scratch


def scratch_env(scratch: Path) -> dict[str, str]:
    """The .venv's Python imports the scratch copy's package, in pytest and in every process
    the tests start (PYTHONPATH is searched before the editable install's finder); no
    bytecode is written, so a restored file is never run from its mutant's .pyc."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(scratch), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_scratch(scratch: Path) -> None:
    """Fail loudly if a process started elsewhere would import the checkout instead."""
    probe = subprocess.run([str(PYTHON), "-c", "import hpo_orchestrator; print(hpo_orchestrator.__file__)"],
                           cwd=tempfile.gettempdir(), env=scratch_env(scratch), capture_output=True,
                           text=True, check=True)
    imported = Path(probe.stdout.strip()).resolve()
    if not imported.is_relative_to(scratch.resolve()):
        raise RuntimeError(f"the scratch copy's processes import {imported}, not the copy in {scratch}")


def run_pytest(scratch: Path, args: list[str], timeout_s: float) -> tuple[str, str]:
    """(outcome, detail) of the tests: passed / failed / timeout / skipped / error."""
    report = scratch / ".mutation-junit.xml"
    report.unlink(missing_ok=True)
    command = [str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rs",
               f"--junitxml={report}", *args]
    proc = subprocess.Popen(command, cwd=scratch, env=scratch_env(scratch), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _LIVE.add(proc)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return "timeout", f"the guarding tests ran past {timeout_s:.0f} s"
    finally:
        _LIVE.discard(proc)
    tail = " | ".join(output.strip().splitlines()[-3:])
    if proc.returncode == 5:
        return "error", f"no test collected (node ids moved?): {tail}"
    if proc.returncode not in (0, 1) or not report.exists():
        return "error", f"pytest exit {proc.returncode}: {tail}"
    tests, skipped, failed = _junit(report)
    if proc.returncode == 1:
        return "failed", f"{failed[0] if failed else '?'} failed ({_reason(report)})"
    if tests == 0 or skipped:
        return "skipped", f"{skipped} of {tests} guarding tests skipped: {tail}"
    return "passed", f"{tests} tests passed"


def _stop(proc: subprocess.Popen[str]) -> None:
    """Kill pytest's own session: it and the studies it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _junit(path: Path) -> tuple[int, int, list[str]]:
    """(tests, skipped, failed test ids) from pytest's junit XML."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failed = [f"{c.get('classname', '').rsplit('.', 1)[-1]}::{c.get('name')}"
              for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    return len(cases), skipped, failed


def _reason(path: Path) -> str:
    """The first failure's message, one line (an assertion's first line, an error's type)."""
    for case in ET.parse(path).getroot().iter("testcase"):
        for tag in ("failure", "error"):
            found = case.find(tag)
            if found is not None:
                return " ".join((found.get("message") or tag).split())[:160]
    return "?"


def apply(scratch: Path, mutation: Mutation) -> str | None:
    """Write the mutant into the scratch copy; the reason it cannot, or None."""
    path = scratch / mutation.file
    if not path.is_file():
        return f"{mutation.file} does not exist"
    count = path.read_text().count(mutation.original)
    if count != 1:
        return f"snippet found {count} times in {mutation.file} (must be exactly once: update the entry)"
    path.write_text(path.read_text().replace(mutation.original, mutation.replacement))
    return None


def run_one(scratch: Path, mutation: Mutation) -> Result:
    started = time.monotonic()
    path = scratch / mutation.file
    pristine = path.read_text() if path.is_file() else None
    try:
        problem = apply(scratch, mutation)
        if problem:
            return Result(mutation, "error", problem, time.monotonic() - started)
        outcome, detail = run_pytest(scratch, mutation.pytest_args(), mutation.timeout_s)
    finally:
        if pristine is not None:
            path.write_text(pristine)
    verdict = {"failed": "killed", "timeout": "killed", "passed": "survived"}.get(outcome, "error")
    return Result(mutation, verdict, detail, time.monotonic() - started)


def baseline(scratch: Path, mutations: list[Mutation]) -> tuple[str, str]:
    """The guarding tests on the unmutated copy: those named without -k in one run, each
    selection narrowed by -k in its own (a -k narrows only its mutation's run)."""
    plain = list(dict.fromkeys(t for m in mutations if not m.k for t in m.tests))
    narrowed = list(dict.fromkeys(tuple(m.pytest_args()) for m in mutations if m.k))
    runs = ([plain] if plain else []) + [list(args) for args in narrowed]
    details, worst = [], "passed"
    for args in runs:
        outcome, detail = run_pytest(scratch, args, timeout_s=DEFAULT_TIMEOUT_S * 4)
        if outcome not in ("passed", "skipped"):
            return outcome, f"{' '.join(args)[:200]}: {detail}"
        worst = "skipped" if outcome == "skipped" else worst
        details.append(detail)
    return worst, "; ".join(details)


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _table(results: list[Result]) -> str:
    lines = ["| mutation | file | result | seconds | detail |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.mutation.name} | {r.mutation.file} | {r.outcome} | {r.seconds:.0f} | "
                     f"{r.detail.replace('|', '/')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at once (default 1)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run of the guarding tests on the unmutated copy")
    parser.add_argument("--touched", action="store_true",
                        help="the mutations whose module, guarding test file or entry changed "
                             "since the last landed commit (or --since)")
    parser.add_argument("--since", metavar="REV",
                        help="with --touched: changed since REV (default: the commit .ci/landed "
                             "names, else the newest commit of HEAD's first-parent line 3 "
                             "hours or more older than HEAD)")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="and N of the others, a window of the list that moves with each commit")
    args = parser.parse_args(argv)
    try:
        mutations = load()
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"error: {exc}\nhint: fix the entry in {MUTATIONS_DIR}", file=sys.stderr)
        return 2
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutations})
        if unknown:
            print(f"error: no mutation named {', '.join(unknown)}\nhint: --list shows them", file=sys.stderr)
            return 2
        mutations = [m for m in mutations if m.name in args.only]
    if args.sample < 0:
        print("error: --sample must be 0 or more", file=sys.stderr)
        return 2
    if args.since and not args.touched:
        print("error: --since goes with --touched", file=sys.stderr)
        return 2
    if args.touched or args.sample:
        try:
            mutations, why = choose(mutations, since=args.since, use_touched=args.touched,
                                    sample=args.sample)
        except subprocess.CalledProcessError as exc:
            print(f"error: git could not tell what changed: {(exc.stderr or '').strip()}\n"
                  "hint: run in a git checkout; --since takes a commit of it", file=sys.stderr)
            return 2
        print(why, flush=True)
        if not mutations:
            print("nothing to run")
            return 0
    if args.list:
        for m in mutations:
            print(f"{m.name}  ({m.source}) {m.file}\n    tests: {' '.join(m.pytest_args())}\n"
                  f"    why: {m.why}")
        return 0
    if args.jobs < 1:
        print("error: --jobs must be 1 or more", file=sys.stderr)
        return 2
    if not PYTHON.exists():
        print(f"error: {PYTHON} not found\nhint: make install", file=sys.stderr)
        return 2
    # Stopped (Ctrl-C, SIGTERM, CI's timeout): no pytest and no study left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _run_all(mutations, args.jobs, not args.no_baseline)
    except KeyboardInterrupt:
        return 130


def _run_all(mutations: list[Mutation], jobs: int, with_baseline: bool) -> int:
    started, load_before = time.monotonic(), _load_average()
    with tempfile.TemporaryDirectory(prefix="hpo-mutation-") as parent:
        scratches: queue.Queue[Path] = queue.Queue()
        for index in range(min(jobs, len(mutations))):
            scratch = make_scratch(Path(parent), index)
            check_imports_scratch(scratch)
            scratches.put(scratch)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
        try:
            if with_baseline and not _baseline_passes(scratches, mutations):
                return 2
            results = _mutate(pool, scratches, mutations)
        finally:
            for proc in list(_LIVE):  # stopped early (Ctrl-C, SIGTERM): no pytest left running
                _stop(proc)
            pool.shutdown(wait=True, cancel_futures=True)
    counts = {o: sum(r.outcome == o for r in results) for o in ("killed", "survived", "error")}
    print()
    print(_table(results))
    print(f"\n{counts['killed']} killed, {counts['survived']} survived, {counts['error']} errors of "
          f"{len(results)} mutations in {time.monotonic() - started:.0f} s (jobs {jobs}); load average "
          f"before {load_before}, after {_load_average()}; {os.cpu_count()} CPUs")
    return 0 if counts["killed"] == len(results) else 1


def _baseline_passes(scratches: queue.Queue[Path], mutations: list[Mutation]) -> bool:
    scratch = scratches.get()
    try:
        outcome, detail = baseline(scratch, mutations)
    finally:
        scratches.put(scratch)
    print(f"baseline (unmutated): {outcome}: {detail}", flush=True)
    if outcome in ("passed", "skipped"):  # a mutation whose tests skip is an error of its own
        return True
    print("error: the guarding tests do not pass on the unmutated code, so no mutation result "
          "would mean anything", file=sys.stderr)
    return False


def _mutate(pool: concurrent.futures.ThreadPoolExecutor, scratches: queue.Queue[Path],
            mutations: list[Mutation]) -> list[Result]:
    def task(mutation: Mutation) -> Result:
        scratch = scratches.get()  # a scratch copy of its own while it runs
        try:
            return run_one(scratch, mutation)
        finally:
            scratches.put(scratch)

    results = []
    for result in pool.map(task, mutations):
        results.append(result)
        print(f"{result.outcome:8} {result.seconds:5.0f} s  {result.mutation.name}: {result.detail}",
              flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
