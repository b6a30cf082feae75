"""One error hierarchy; the CLI turns each into ``error: ...`` / ``hint: ...`` and an exit code."""

from __future__ import annotations

import re

__all__ = ["SECRET_QUERY_KEYS", "ConfigError", "HpoError", "RuntimeFailure", "StorageError",
           "mask_passwords", "url_passwords"]

# scheme://user:PASSWORD@host: the password runs to the last '@' before a space, so one that
# holds an unescaped '@' (or that SQLAlchemy cannot parse at all) is masked whole. A scheme
# starts a word, and each part is bounded: unbounded, a 30,000-character error message of a
# trial took 5 s to mask (each of its letters tried as a scheme's start, the rest scanned).
_URL_PASSWORD = re.compile(r"((?<![A-Za-z0-9+.-])[A-Za-z][\w+.-]{0,40}://[^\s:/@'\"]{0,256}:)[^\s]{0,512}@")
_ARG_PASSWORD = re.compile(r"://[^:/@]*:(.+)@")
# Query parameters that carry a secret (libpq's password, the client key's sslpassword, and the
# passfile that names where the password lies): masked as a password in user:pw@ is.
SECRET_QUERY_KEYS = ("password", "sslpassword", "passfile")
_QUERY_SECRET = re.compile(r"([?&](?:" + "|".join(SECRET_QUERY_KEYS) + r")=)[^&#\s'\"]*",
                           re.IGNORECASE)


def url_passwords(args: list[str]) -> list[str]:
    """The passwords of the URLs in command-line arguments, each argument read as a whole (a
    password may hold spaces, quotes, ',' or '#': Hydra's parse errors quote them back)."""
    found = [m.group(1) for arg in args if (m := _ARG_PASSWORD.search(arg))]
    return found + [m.group(0).split("=", 1)[1] for arg in args for m in _QUERY_SECRET.finditer(arg)
                    if m.group(0).split("=", 1)[1]]


def mask_passwords(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every URL password (``user:pw@`` and the query's ``password=``,
    ``sslpassword=``, ``passfile=``), and each of ``secrets``, replaced by ***."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


class HpoError(Exception):
    """Root of every error this package raises on purpose.

    ``message`` is one line that names the bad value; ``hint`` says what to do next.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        # masked here, once: a message may quote the user's storage URL back
        message = mask_passwords(message)
        hint = None if hint is None else mask_passwords(hint)
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
