"""What every command shares: the default storage and the two consoles (stdout, stderr)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

__all__ = ["DEFAULT_STORAGE", "StdoutClosed", "console", "errors", "printable", "silence_stdout"]

DEFAULT_STORAGE = "sqlite:///hpo.db"

# C0 controls but newline and tab, DEL and the C1 controls: ESC starts the sequences that
# recolor, move the cursor, retitle the window or (OSC 52) write the clipboard; C1's CSI/OSC
# are their one-byte forms.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each control character replaced by U+FFFD: what an objective, its error
    text or anyone who writes the database put in a string reaches the terminal as text,
    never as a command to it."""
    return _CONTROL.sub("\ufffd", text)


def silence_stdout() -> None:
    """Point stdout at /dev/null: the reader left (``| head``), and Python's flush at exit
    must not complain about it on stderr."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class StdoutClosed(BrokenPipeError):
    """Our stdout's reader left; a BrokenPipeError of any other pipe is a real error."""


class _Console(Console):
    """Every command's console. Each piece of text it renders passes through ``printable``
    (tables, findings, progress lines, errors alike: one place, not a habit per field); rich's
    own styles and cursor moves come after, as control segments and escapes of its own."""

    def render(self, renderable: RenderableType,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROL.search(segment.text):
                yield Segment(printable(segment.text), segment.style)
            else:
                yield segment

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
