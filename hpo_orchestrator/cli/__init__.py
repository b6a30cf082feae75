"""Command line: ``hpo-orchestrator run|submit|status|logs|best|artifacts|enqueue|report|
tune-pruner|telemetry|gpus``.

The one place that turns an HpoError into ``error: ...`` / ``hint: ...`` and an exit code
(0 done, 1 runtime failure, 2 bad usage or configuration, 130 interrupted). Tracebacks only
with ``--debug``. One module per command group; this one dispatches and reports errors.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence

from hpo_orchestrator.cli import _artifacts, _first_hour
from hpo_orchestrator.cli._common import StdoutClosed, silence_stdout
from hpo_orchestrator.cli._common import console as _console
from hpo_orchestrator.cli._common import errors as _errors
from hpo_orchestrator.cli._gpus import cmd_gpus
from hpo_orchestrator.cli._params import cmd_best, cmd_enqueue
from hpo_orchestrator.cli._parser import build_parser
from hpo_orchestrator.cli._reports import cmd_report, cmd_status, cmd_telemetry, cmd_tune_pruner
from hpo_orchestrator.cli._run import cmd_run, cmd_submit
from hpo_orchestrator.errors import HpoError, mask_passwords, url_passwords

__all__ = ["EXIT_STDOUT_CLOSED", "main"]

EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left


def _debug_logging() -> None:
    """``--debug``: our DEBUG lines on stderr too (the loop's slow duties, scheduler/_recipe.py)."""
    log = logging.getLogger("hpo_orchestrator")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG)


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    runner = sys.modules.get("hpo_orchestrator.runner")  # loaded by a run alone
    if argv is None and runner is not None and any(t.is_alive() for t in runner.IMPORT_THREADS):
        # the objective's module started a thread that is no daemon: Python would wait for it
        # after the run, forever; the run's work is all written by now
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # anywhere: `status --debug` and `run ... --debug` too
    argv = [a for a in argv if a != "--debug"]
    if debug:
        _debug_logging()
    secrets = url_passwords(argv)
    console = _console()
    errors = _errors()
    command = None

    def say(line: str) -> None:
        errors.print(mask_passwords(line, secrets), markup=False)

    def failed_on_file(exc: OSError) -> int:
        """A file of ours (lock, run folder, output) and not the storage: say which one. The
        orchestrator left a run's running trials RUNNING for the next run to recover."""
        trace(exc)
        say(f"error: {_what_failed(exc)}")
        say("hint: check that the folder exists, has free space and that this user may write "
            "there" + ("; the same command resumes the run" if command == "run" else ""))
        return 1

    def trace(exc: BaseException) -> None:
        if debug:  # masked too: Hydra's messages quote the override whole, password and all
            sys.stderr.write(mask_passwords("".join(traceback.format_exception(exc)), secrets))

    try:
        args = build_parser().parse_args(argv)
        command = args.command
        commands = {"run": cmd_run, "status": cmd_status, "telemetry": cmd_telemetry,
                    "gpus": cmd_gpus, "report": cmd_report,
                    "submit": lambda a, c: cmd_submit(a, c, main),
                    "tune-pruner": cmd_tune_pruner, "best": cmd_best, "enqueue": cmd_enqueue,
                    "logs": lambda a, c: _first_hour.cmd_logs(a, c, errors),
                    "artifacts": lambda a, c: _artifacts.cmd_artifacts(a, c, errors)}
        return commands[command](args, console)
    except HpoError as exc:
        trace(exc)
        say(f"error: {exc.message}")
        if exc.hint:
            say(f"hint: {exc.hint}")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError as exc:
        if command == "run" and not isinstance(exc, StdoutClosed):
            return failed_on_file(exc)  # a pipe of the run other than stdout
        # The reader left (`| head`): end quietly, as other CLIs do. Other commands gave what
        # was asked for (0); a run stopped short of its study says so by its code.
        silence_stdout()
        trace(exc)
        return EXIT_STDOUT_CLOSED if command == "run" else 0
    except OSError as exc:
        return failed_on_file(exc)
    except Exception as exc:
        trace(exc)
        say(f"error: unexpected {type(exc).__name__}: {exc}")
        say("hint: run again with --debug for the traceback, and report it")
        return 1


def _what_failed(exc: OSError) -> str:
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    target = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{target}: {reason}"
