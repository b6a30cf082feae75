"""What every command shares: the default storage and the two consoles (stdout, stderr)."""

from __future__ import annotations

import os

from rich.console import Console

__all__ = ["DEFAULT_STORAGE", "console", "errors"]

DEFAULT_STORAGE = "sqlite:///hpo.db"


def errors() -> Console:
    """stderr: never wrapped, so an error line stays one line in a log or a pipe."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def console() -> Console:
    """stdout. A terminal gets rich's layout at its width; a pipe or file is not hard-wrapped
    at 80 columns (lines stay whole; tables take the width they need)."""
    probe = Console()
    if probe.is_terminal or "COLUMNS" in os.environ:
        return probe
    return Console(width=200, soft_wrap=True)

