"""The commands that read a study: ``status``, ``telemetry``, ``report`` and ``tune-pruner``."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console

from hpo_orchestrator.cli import _first_hour
from hpo_orchestrator.cli._common import DEFAULT_STORAGE, errors
from hpo_orchestrator.errors import Absent, ConfigError

__all__ = ["cmd_report", "cmd_status", "cmd_telemetry", "cmd_tune_pruner"]


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    if args.trial is not None:
        return _first_hour.print_trial(args, console, errors())
    if args.json and _status_json_sqlite(args):
        return 0

    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.status import collect_status, render_status

    if args.watch:
        from hpo_orchestrator._signals import handling_stop_signals

        # Only a signal ends the watch ("Ctrl-C to stop"), so its handlers are set here, not
        # inherited: a shell without job control (a script's `cmd &`) starts its background
        # jobs with SIGINT ignored, Python leaves an inherited SIG_IGN as it is, and the
        # watch could then only be killed (the main's KeyboardInterrupt: exit 130).
        with handling_stop_signals():
            return _watch(args, console)
    engine = create_engine(args.storage)
    given = args.study  # the commands advice quotes name it where the user did

    def typed(text: str) -> str:
        return _first_hour.as_typed(text, args.storage, DEFAULT_STORAGE, given)

    args.study = _first_hour.resolve_study(engine, args.study, errors())
    if args.json:
        print(json.dumps(collect_status(engine, args.study).to_json(), indent=2, default=str))
        return 0
    console.print(render_status(collect_status(engine, args.study), typed))
    return 0


def _watch(args: argparse.Namespace, console: Console) -> int:
    """``status --watch``: refreshed in place on a terminal; to a file or a pipe, one plain
    summary per interval, each under a line with its time (a log shows how the study went).
    Started before the run has made the database or the study, it says what it waits for,
    once, and waits: people start it beside the run, which creates both."""
    from rich.live import Live

    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.status import collect_status, render_status

    given = args.study

    def typed(text: str) -> str:
        return _first_hour.as_typed(text, args.storage, DEFAULT_STORAGE, given)

    engine, waiting = None, False
    while engine is None:
        try:
            engine = create_engine(args.storage)
            args.study = _first_hour.resolve_study(engine, given, errors())
            first = render_status(collect_status(engine, args.study), typed)
        except Absent as absent:
            if engine is not None:
                engine.dispose()
                engine = None
            if not waiting:
                errors().print(f"{absent.message}: waiting for a run to create it (checking "
                               f"every {args.interval:g} s; Ctrl-C to stop)", markup=False)
                waiting = True
            time.sleep(args.interval)
    if not console.is_terminal:
        while True:
            console.print(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} ---", highlight=False)
            console.print(first)
            console.file.flush()
            time.sleep(args.interval)
            first = render_status(collect_status(engine, args.study), typed)
    with Live(first, console=console, auto_refresh=False) as live:
        while True:
            time.sleep(args.interval)
            live.update(render_status(collect_status(engine, args.study), typed), refresh=True)

def _status_json_sqlite(args: argparse.Namespace) -> bool:
    """``status --json`` of a plain sqlite study, read through sqlite3 alone (importing
    SQLAlchemy would cost more than the read of a study with a kept tally: docs/BENCHMARKS.md
    "status from a kept tally"); False, nothing printed, for any other storage (or anything
    unusual about the file: db.open_sqlite), which the engine's path reads."""
    from contextlib import closing

    from hpo_orchestrator.db import open_sqlite
    from hpo_orchestrator.status import collect_status_sqlite

    connection = open_sqlite(args.storage)
    if connection is None:
        return False
    with closing(connection):
        args.study = _first_hour.resolve_study(connection, args.study, errors())
        report = collect_status_sqlite(connection, args.study)
    print(json.dumps(report.to_json(), indent=2, default=str))
    return True


_SUFFIX = {"--out": ".html", "--png": ".png", "--csv": ".csv"}


def check_output(path: Path, option: str) -> None:
    """An output file this user can write, checked before anything is read (exit 2): not a
    folder, and its folder takes a new file (the commands write a temporary file beside it
    and rename it)."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder",
                          f"name a file, e.g. {option} {path / ('out' + _SUFFIX[option])}")
    if not path.parent.is_dir():
        return  # the command's own check says so, with its hint
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe."):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot write in {path.parent} ({exc.strerror or exc})",
                          f"write it elsewhere, e.g. {option} {Path.home() / path.name}") from None


def cmd_telemetry(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.telemetry import export_csv

    if args.csv != "-":
        check_output(Path(args.csv), "--csv")
    engine = create_engine(args.storage)
    count = export_csv(engine, _first_hour.resolve_study(engine, args.study, errors()), args.trial,
                       args.csv)
    if args.csv != "-":
        errors().print(f"wrote {count} samples to {args.csv}", highlight=False)
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.db.connect import create_engine
    from hpo_orchestrator.report import lane_device, write_report

    for path, option in ((args.out, "--out"), (args.png, "--png")):
        if path is not None:
            check_output(path, option)
    last = _last(args.last)
    engine = create_engine(args.storage)
    data = write_report(engine, _first_hour.resolve_study(engine, args.study, errors()), args.out,
                        args.png, last)
    # Absolute: `make report` runs from the checkout or (make -f) another folder.
    written = " and ".join(str(p.resolve()) for p in (args.out, args.png) if p is not None)
    console.print(f"wrote {written}: study {data.study!r}, {len(data.bars)} trials on "
                  f"{len({lane_device(lane) for lane in data.lanes})} device(s)",
                  highlight=False, soft_wrap=True)
    return 0


def cmd_tune_pruner(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator import db
    from hpo_orchestrator.db.connect import create_engine, paste_url
    from hpo_orchestrator.pruning import (
        LIMITS,
        default_grid,
        load_curves,
        recommend,
        recommended_command,
        render_tuning,
        tune,
    )
    from hpo_orchestrator.scheduler import run_dir

    if args.top_k < 1:
        raise ConfigError(f"--top-k: expected an integer >= 1, got {args.top_k}", "e.g. --top-k 5")
    if (args.min_resource and min(args.min_resource) < 1) or (args.reduction_factor and \
            min(args.reduction_factor) < 2):
        raise ConfigError("--min-resource takes integers >= 1 and --reduction-factor integers >= 2",
                          "e.g. --min-resource 1,3,5 --reduction-factor 2,3")
    last = _last(args.last)
    engine = create_engine(args.storage)
    curves = load_curves(engine, _first_hour.resolve_study(engine, args.study, errors()), last)
    grid = default_grid(curves.full_step, args.patience, args.min_resource, args.reduction_factor)
    results = tune(curves, grid, args.top_k)
    choice, reason = recommend(results)
    with db.read_errors(), engine.connect() as connection:
        taken = set(db.list_studies(connection))
    storage, secret_note = paste_url(args.storage)
    command = recommended_command(_first_hour.prog(), curves.study, curves.config,
                                  choice.setting.overrides(), taken,
                                  None if args.storage == DEFAULT_STORAGE else storage,
                                  run_dir(args.storage, curves.study).name)
    if args.json:
        print(json.dumps({"study": curves.study, "direction": curves.direction,
                          "full_step": curves.full_step, "first_trial": curves.first_number,
                          "limits": LIMITS,
                          "recommendation": {**choice.to_json(), "reason": reason,
                                             "command": command, "note": secret_note},
                          "results": [r.to_json() for r in results]}, indent=2))
        return 0
    shown = command + (f"  ({secret_note})" if secret_note else "")
    console.print(render_tuning(curves, results, choice, reason, None if args.all else 15, shown))
    return 0


def _last(value: int) -> int | None:
    """--last N: None (every trial) for 0."""
    if value < 0:
        raise ConfigError(f"--last: expected an integer >= 0, got {value}",
                          "e.g. --last 1000 for the newest 1000 trials, --last 0 for all")
    return value or None
