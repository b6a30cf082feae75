"""The CLI's first-hour helpers: ``logs``, ``status --trial N``, the study a command means when
none is named, and the next commands a run suggests (as the user can type them: ``make ...``
when the run came from make, else the command they typed)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from hpo_orchestrator import keys
from hpo_orchestrator.cli._common import printable
from hpo_orchestrator.errors import ConfigError, HpoError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["add_logs_parser", "as_typed", "cmd_logs", "next_steps", "print_trial", "prog",
           "resolve_study", "resume_hint", "run_again"]

_FOLLOW_POLL_S = 0.5


def prog() -> str:
    """How the user started us, for the commands we suggest: ``hpo-orchestrator`` when that is
    on PATH, else the path they typed (``.venv/bin/hpo-orchestrator`` before activation)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0.endswith("__main__.py"):
        return "python -m hpo_orchestrator"
    on_path = shutil.which("hpo-orchestrator")
    if Path(argv0).name != "hpo-orchestrator" or (
            on_path and Path(on_path).resolve() == Path(argv0).resolve()):
        return "hpo-orchestrator"
    return argv0


def _under_make() -> bool:
    return "MAKELEVEL" in os.environ  # make exports it to its recipes


def _make() -> str:
    """This project's Makefile as the user can run it where they are: ``make`` in the
    checkout, ``make -f <checkout>/Makefile`` from another folder (the Makefile exports which
    as HPO_MAKE to its recipes)."""
    return os.environ.get("HPO_MAKE") or "make"


def run_again(overrides: list[str], extra: str) -> str:
    """The run command again with ``extra`` added (e.g. study.add_trials=20)."""
    kept = [o for o in overrides if not o.startswith(("study.add_trials=", "study.n_trials="))]
    if _under_make():
        par = [o for o in kept if o.startswith("scheduler.parallel=")]
        rest = [o for o in kept if not o.startswith("scheduler.parallel=")]
        par_arg = f"PAR={par[-1].split('=', 1)[1]} " if par else ""
        return f'{_make()} hpo {par_arg}ARGS="{" ".join([*rest, extra])}"'
    return " ".join([prog(), "run", *map(shlex.quote, kept), extra])


def resume_hint(overrides: list[str], add_trials: int | None, total: int | None) -> str:
    """How to continue a stopped run. ``study.add_trials=N`` is resolved at each start (the
    trials ended by then + N), so the same command would add N again: give the total instead."""
    if add_trials is None or total is None:
        return "run the same command again"
    return f"run '{run_again(overrides, f'study.n_trials={total}')}' (the same command with " \
           f"study.add_trials={add_trials} would add {add_trials} more again)"


# the commands that read a study: a quoted one gets the study and the storage it is about
_READS = ("logs", "status", "report", "best", "artifacts", "tune-pruner", "telemetry")


def as_typed(text: str, storage: str, default_storage: str, study: str | None = None,
             with_note: bool = True) -> str:
    """Commands quoted in a message ('hpo-orchestrator logs 3') as this user can type them:
    with ``--study`` (where given: None for the one the command would pick anyway) and the
    storage where it is not the default, its password left out (paste_url), and then, with
    ``with_note``, where the password comes from instead."""
    import re

    from hpo_orchestrator.db.connect import paste_url

    shown, note = paste_url(storage)
    stored: list[bool] = []  # a --storage was added

    def typed(match: re.Match[str]) -> str:
        command, rest = match.group(1), match.group(2)
        if _under_make() and storage == default_storage and study is None \
                and command in ("logs", "status", "report"):
            if command == "logs" and rest.strip().isdigit():
                return f"'{_make()} logs TRIAL={rest.strip()}'"
            if not rest.strip():
                return f"'{_make()} {command}'"
        if command in _READS:
            if study is not None and "--study" not in rest:
                rest += f" --study {shlex.quote(study)}"
            if storage != default_storage and "--storage" not in rest:
                rest += f" --storage {shlex.quote(shown)}"
                stored.append(True)
        return f"'{prog()} {command}{rest}'"

    out = re.sub(r"'hpo-orchestrator (\w[\w-]*)([^']*)'", typed, text)
    return out + (f" ({note})" if note and stored and with_note else "")


def next_steps(storage: str, default_storage: str, failed: int | None) -> str:
    """One line of what to run next, after a run. A password in the URL is never printed: the
    URL is shown without it, and the line says where it comes from instead (PGPASSWORD or
    ~/.pgpass for PostgreSQL), so the commands still paste."""
    from hpo_orchestrator.db.connect import paste_url

    storage_shown, secret_note = paste_url(storage)
    if _under_make() and storage == default_storage:
        steps = [f"{_make()} status", f"{_make()} report"] + (
            [f"{_make()} logs TRIAL={failed}"] if failed is not None else [])
    else:
        where = "" if storage == default_storage else f" --storage {shlex.quote(storage_shown)}"
        steps = [f"{prog()} status{where}", f"{prog()} report{where} --out report.html"] + (
            [f"{prog()} logs {failed}{where}"] if failed is not None else [])
    return "next: " + "  |  ".join(steps) + (f"  ({secret_note})" if secret_note else "")


def resolve_study(engine: Engine | sqlite3.Connection, study: str | None,
                  errors: Console) -> str | None:
    """``--study`` as given; else the only study; else the most recently run one, said on
    stderr. ``engine``: or a plain sqlite3 connection (``status --json``, db/_sql.py)."""
    from contextlib import nullcontext

    from hpo_orchestrator import db

    if study is not None:
        return study
    try:
        with db.read_errors(), (nullcontext(engine) if isinstance(engine, sqlite3.Connection)
                                else engine.connect()) as connection:
            names = db.list_studies(connection)
            latest = db.latest_study(connection) if len(names) > 1 else None
    except HpoError:
        return None  # the command's own checks come first, then its read says what is wrong
    if latest is None:
        return None
    errors.print(f"study {latest!r}: the most recently run of {len(names)} in this storage "
                 f"(--study NAME for another: {', '.join(names)})", markup=False)
    return latest


def _detail(engine: Engine, study: str | None, number: int) -> tuple[str, dict[str, Any]]:
    from hpo_orchestrator import db

    with db.read_errors(), engine.connect() as connection:
        study_id, name = db.study_id_of(connection, study)
        detail = db.trial_detail(connection, study_id, number)
    if detail is None:
        raise ConfigError(f"study {name!r} has no trial {number}",
                          f"'{prog()} status' shows how many trials it has")
    return name, detail


def add_logs_parser(commands: argparse._SubParsersAction, storage_default: str) -> None:  # type: ignore[type-arg]
    logs = commands.add_parser("logs", help="a trial's output (print, logging, native crashes) and "
                                            "traceback")
    logs.add_argument("trial", type=int, metavar="TRIAL", help="trial number")
    logs.add_argument("--storage", default=storage_default, help=f"default {storage_default}")
    logs.add_argument("--study", help="study name (default: the most recently run)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new output while the trial runs")


def cmd_logs(args: argparse.Namespace, console: Console, errors: Console) -> int:
    from hpo_orchestrator.db.connect import create_engine

    engine = create_engine(args.storage)
    name, detail = _detail(engine, resolve_study(engine, args.study, errors), args.trial)
    attrs = detail["attrs"]
    path = Path(attrs[keys.LOG_PATH]) if attrs.get(keys.LOG_PATH) else None
    if path is None or not path.exists():
        traceback = attrs.get(keys.TRACEBACK)
        if traceback:  # the storage keeps it even where the log file is out of reach
            errors.print(f"no log file for trial {args.trial} here ({path or 'none recorded'}); "
                         "its stored traceback:", markup=False)
            console.out(traceback, highlight=False)
            return 0
        host = f" on host {attrs[keys.HOST]}" if attrs.get(keys.HOST) else ""
        raise ConfigError(f"trial {args.trial} of study {name!r} has no log file here "
                          f"({path or 'none recorded'})",
                          f"logs are written{host} where the run ran (scheduler.log_dir); "
                          "trials of runs before logs were kept have none")
    rotated = path.with_name(path.name + ".1")
    if rotated.exists():
        errors.print(f"(earlier output of this trial: {rotated})", markup=False)
    offset = _print_from(path, 0)
    if offset == 0 and not args.follow:  # an empty log is not "no output from the command"
        errors.print(f"trial {args.trial} of study {name!r} printed nothing (its log {path} is "
                     f"empty); {_outcome(detail, args.trial)}", markup=False)
    if args.follow:
        from hpo_orchestrator._signals import handling_stop_signals

        # Ctrl-C ends a follow of a trial that runs on: set here, not inherited (a script's
        # background job starts with SIGINT ignored; cli/_reports.py, status --watch)
        with handling_stop_signals():
            _follow(engine, name, args.trial, path, offset, errors)
    return 0


def _follow(engine: Engine, name: str, number: int, path: Path, offset: int,
            errors: Console) -> None:
    while True:
        time.sleep(_FOLLOW_POLL_S)
        offset = _print_from(path, offset)
        _, detail = _detail(engine, name, number)
        if detail["state"] != "RUNNING":
            _print_from(path, offset)
            errors.print(f"trial {number} ended: {detail['state']}", markup=False)
            return


def _outcome(detail: dict[str, Any], number: int) -> str:
    """How the trial ended, for a log that holds nothing to say it."""
    state, attrs = detail["state"], detail["attrs"]
    if state == "COMPLETE":
        values = detail.get("values") or []
        value = f"values {', '.join(repr(v) for v in values)}" if len(values) > 1 \
            else f"value {detail['value']!r}"
        return f"it ended COMPLETE, {value}"
    if state == "FAIL":
        reason = attrs.get(keys.FAIL_REASON)
        return f"it ended FAIL: {reason}: {attrs.get(keys.ERROR)}" if reason else "it ended FAIL"
    if state == "RUNNING":
        return f"it is still RUNNING ('{prog()} logs {number} --follow' waits for its output)"
    return f"it ended {state}" if state == "PRUNED" else f"it is {state}"


def _print_from(path: Path, offset: int) -> int:
    """Print ``path`` from ``offset``; the new offset (0 again after a rotation truncated it)."""
    try:
        size = path.stat().st_size
        if size < offset:
            offset = 0
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return offset
    # The trial's own output, as text: a progress bar's lone '\r' starts a line, every other
    # control character is shown, not obeyed
    text = data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    sys.stdout.write(printable(text))
    sys.stdout.flush()
    return offset + len(data)


def print_trial(args: argparse.Namespace, console: Console, errors: Console) -> int:
    """``status --trial N``: one trial's state, value, params, failure, traceback and log."""
    from hpo_orchestrator.db.connect import create_engine, paste_url

    engine = create_engine(args.storage)
    name, detail = _detail(engine, resolve_study(engine, args.study, errors), args.trial)
    if args.json:
        print(json.dumps({"study": name, **detail}, indent=2, default=str))
        return 0
    attrs = detail["attrs"]
    duration = (detail["end"] - detail["start"]).total_seconds() \
        if detail["start"] and detail["end"] else None
    lines = [f"study {name!r} trial {args.trial}: {detail['state']}"
             + (f", values {', '.join(repr(v) for v in detail['values'])}"
                if len(detail["values"]) > 1 else
                f", value {detail['value']!r}" if detail["value"] is not None else "")
             + (f", {duration:.1f} s" if duration is not None else "")]
    if detail["params"]:
        lines.append("params: " + " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                           for k, v in detail["params"].items()))
    where = [f"{k.removeprefix('hpo.')}={attrs[k]}" for k in
             (keys.HOST, keys.GPU_INDEX, keys.SLOT, keys.PID, keys.EXIT_CODE)
             if attrs.get(k) is not None]  # a trial that returned has no exit code
    if where:
        lines.append("ran on: " + " ".join(where))
    if attrs.get(keys.FAIL_REASON):
        lines.append(f"failed: {attrs[keys.FAIL_REASON]}: {attrs.get(keys.ERROR)}")
    for line in lines:
        console.print(escape(line), highlight=False)
    if attrs.get(keys.TRACEBACK):
        console.print("traceback:", style="bold")
        console.out(attrs[keys.TRACEBACK].rstrip(), highlight=False)
    if attrs.get(keys.LOG_PATH):
        from hpo_orchestrator.cli._common import DEFAULT_STORAGE

        logs = as_typed(f"'hpo-orchestrator logs {args.trial}'", args.storage, DEFAULT_STORAGE,
                        args.study, with_note=False)[1:-1]  # quoted once, whole
        console.print(escape(f"log: {attrs[keys.LOG_PATH]}  ({logs})"), highlight=False)
        note = paste_url(args.storage)[1]
        if note and args.storage != DEFAULT_STORAGE:
            console.print(escape(f"  ({note})"), highlight=False)
    return 0

