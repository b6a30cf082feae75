"""One error hierarchy; the CLI turns each into ``error: ...`` / ``hint: ...`` and an exit code."""

from __future__ import annotations

__all__ = ["ConfigError", "HpoError", "RuntimeFailure", "StorageError"]


class HpoError(Exception):
    """Root of every error this package raises on purpose.

    ``message`` is one line that names the bad value; ``hint`` says what to do next.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(HpoError):
    """Bad usage or configuration, found before anything is written (exit 2)."""

    exit_code = 2


class StorageError(HpoError):
    """The storage cannot be reached or is not an Optuna database (exit 2: nothing was written)."""

    exit_code = 2


class RuntimeFailure(HpoError):
    """The run started but could not go on (exit 1)."""

    exit_code = 1
