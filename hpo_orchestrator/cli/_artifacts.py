"""``hpo-orchestrator artifacts``: list or fetch the files a trial kept (the best one's by
default), through hpo_orchestrator/artifacts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

__all__ = ["add_artifacts_parser", "cmd_artifacts", "mention_best"]


def add_artifacts_parser(commands: Any, default_storage: str) -> None:
    parser = commands.add_parser("artifacts", help="list or fetch the files trials kept with "
                                                   "save_artifact (the best trial's by default)")
    parser.add_argument("--storage", default=default_storage, help=f"default {default_storage}")
    parser.add_argument("--study", help="study name (default: the most recently run)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, metavar="N", help="this trial's artifacts")
    which.add_argument("--best", action="store_true",
                       help="the best trial's (the default; the Pareto front's with several objectives)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="copy them into DIR (created; nothing is overwritten)")
    parser.add_argument("--store", type=Path, metavar="DIR",
                        help="the store's folder, when it moved since the run (default: where "
                             "the run wrote each file)")
    parser.add_argument("--json", action="store_true", help="machine-readable list")


def cmd_artifacts(args: argparse.Namespace, console: Console, errors: Console) -> int:
    from hpo_orchestrator import artifacts
    from hpo_orchestrator.cli._first_hour import prog, resolve_study
    from hpo_orchestrator.db.connect import create_engine

    engine = create_engine(args.storage)
    fetched = artifacts.select(engine, resolve_study(engine, args.study, errors), args.trial)
    which = f"trial #{args.trial}" if args.trial is not None else \
        "best trial " + ", ".join(f"#{n}" for n in fetched.numbers)
    if args.out is not None:
        written = artifacts.download(fetched, args.out, args.store)
        console.print(f"study {fetched.study!r}, {which}: fetched {len(written)} file(s) into "
                      f"{args.out}", highlight=False, markup=False)
        for path in written:
            console.print(f"  {path}", highlight=False, markup=False)
        return 0
    if args.json:
        print(json.dumps({"study": fetched.study, "trials": fetched.numbers,
                          "artifacts": [a._asdict() for a in fetched.artifacts]}, indent=2))
        return 0
    console.print(f"study {fetched.study!r}, {which}: {len(fetched.artifacts)} artifact(s)",
                  highlight=False, markup=False)
    for a in fetched.artifacts:
        console.print(f"  #{a.number}  {escape(a.filename)}  {a.mimetype}  {a.artifact_id}  "
                      f"{escape(a.store or '(store unknown: --store DIR)')}", highlight=False)
    if fetched.artifacts:
        pick = f"--trial {args.trial}" if args.trial is not None else "--best"
        console.print(f"fetch: {prog()} artifacts --study {fetched.study} {pick} --out DIR",
                      highlight=False, markup=False)
    return 0


def mention_best(engine: Any, study: str, console: Console) -> None:
    """``best``'s last line when the best trial kept files: their names and the command that
    fetches them."""
    from hpo_orchestrator import artifacts
    from hpo_orchestrator.cli._first_hour import prog

    fetched = artifacts.select(engine, study, None)
    if fetched.artifacts:
        names = ", ".join(a.filename for a in fetched.artifacts)
        console.print(f"artifacts: {names}; fetch: {prog()} artifacts --study {fetched.study} "
                      "--best --out DIR", highlight=False, markup=False, soft_wrap=True)
