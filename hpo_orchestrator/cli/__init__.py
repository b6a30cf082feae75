"""Command line: ``hpo-orchestrator run|submit|status|logs|best|enqueue|report|tune-pruner|telemetry|gpus``.

The one place that turns an HpoError into ``error: ...`` / ``hint: ...`` and an exit code
(0 done, 1 runtime failure, 2 bad usage or configuration, 130 interrupted). Tracebacks only
with ``--debug``. One module per command group; this one dispatches and reports errors.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hpo_orchestrator import _cli_trials
from hpo_orchestrator.cli._common import console as _console
from hpo_orchestrator.cli._common import errors as _errors
from hpo_orchestrator.cli._gpus import cmd_gpus
from hpo_orchestrator.cli._parser import build_parser
from hpo_orchestrator.cli._reads import cmd_report, cmd_status, cmd_telemetry, cmd_tune_pruner
from hpo_orchestrator.cli._run import cmd_run, cmd_submit
from hpo_orchestrator.cli._study_tools import cmd_best, cmd_enqueue
from hpo_orchestrator.errors import HpoError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    console = _console()
    errors = _errors()
    command = None
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        commands = {"run": cmd_run, "status": cmd_status, "telemetry": cmd_telemetry,
                    "gpus": cmd_gpus, "report": cmd_report, "submit": cmd_submit,
                    "tune-pruner": cmd_tune_pruner, "best": cmd_best, "enqueue": cmd_enqueue,
                    "logs": lambda a, c: _cli_trials.cmd_logs(a, c, errors)}
        return commands[command](args, console)
    except HpoError as exc:
        if debug:
            raise
        errors.print(f"error: {exc.message}", markup=False)
        if exc.hint:
            errors.print(f"hint: {exc.hint}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `status --json | head`: the reader left
        if command in ("status", "telemetry", "gpus", "report", "tune-pruner", "best", "logs"):
            sys.stderr.close()
            return 0
        if debug:
            raise
        errors.print("error: unexpected BrokenPipeError (stdout closed?)", markup=False)
        return 1
    except Exception as exc:
        if debug:
            raise
        errors.print(f"error: unexpected {type(exc).__name__}: {exc}", markup=False)
        errors.print("hint: run again with --debug for the traceback, and report it", markup=False)
        return 1

