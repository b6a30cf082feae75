"""What every command shares: the default storage and the two consoles (stdout, stderr)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["DEFAULT_STORAGE", "StdoutClosed", "console", "errors", "silence_stdout"]

DEFAULT_STORAGE = "sqlite:///hpo.db"


def silence_stdout() -> None:
    """Point stdout at /dev/null: the reader left (``| head``), and Python's flush at exit
    must not complain about it on stderr."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class StdoutClosed(BrokenPipeError):
    """Our stdout's reader left; a BrokenPipeError of any other pipe is a real error."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich's default raises SystemExit(1), which would pass a run's error handling by and
        # end it as if Ctrl-C'd; the CLI decides what a closed stdout means (cli/__init__.py)
        self.quiet = True
        silence_stdout()
        raise StdoutClosed("stdout was closed by its reader")


def errors() -> Console:
    """stderr: never wrapped, so an error line stays one line in a log or a pipe."""
    return _Console(stderr=True, highlight=False, soft_wrap=True)


def console() -> Console:
    """stdout. A terminal gets rich's layout at its width; a pipe or file is not hard-wrapped
    at 80 columns (lines stay whole; tables take the width they need)."""
    probe = _Console()
    if probe.is_terminal or "COLUMNS" in os.environ:
        return probe
    return _Console(width=200, soft_wrap=True)
