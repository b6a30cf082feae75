"""One error hierarchy; the CLI turns each into ``error: ...`` / ``hint: ...`` and an exit code."""

from __future__ import annotations

import re

__all__ = ["SECRET_QUERY_KEYS", "Absent", "ConfigError", "HpoError", "NoDatabase", "NoStudy",
           "RuntimeFailure", "StorageError", "mask_passwords", "url_passwords"]

# scheme://user:PASSWORD@host: the password runs to the last '@' of its word, so one that
# holds an unescaped '@' (or that SQLAlchemy cannot parse at all) is masked whole. Found word
# by word, the scheme's part bounded: one pattern over the whole text took 5 s to mask a
# trial's 30,000-character error message (each letter tried as a scheme's start, the rest
# scanned), and bounding the password instead let a 1 kB token (AWS RDS IAM) through.
_URL_PREFIX = re.compile(r"[A-Za-z][\w+.-]{0,40}://[^\s:/@'\"]{0,256}:")
_SPACES = re.compile(r"(\s+)")
_ARG_URL = re.compile(r"[A-Za-z][\w+.-]{0,40}://[^:/@]*:.+@.*|[A-Za-z][\w+.-]{0,40}://.*[?&]"
                      r"(?:password|sslpassword|passfile)=.*", re.IGNORECASE)
# Query parameters that carry a secret (libpq's password, the client key's sslpassword, and the
# passfile that names where the password lies): masked as a password in user:pw@ is; and the
# same keys in a libpq conninfo string (``host=db password=...``), as a driver may quote it.
SECRET_QUERY_KEYS = ("password", "sslpassword", "passfile")
_QUERY_SECRET = re.compile(r"((?:^|[?&\s])(?:" + "|".join(SECRET_QUERY_KEYS) + r")=)[^&#\s'\"]*",
                           re.IGNORECASE)
_PASSWORD_FILE = re.compile(r'(password file ")[^"]*(")')  # libpq's warnings about a passfile


def url_passwords(args: list[str]) -> list[str]:
    """The URLs with a secret in command-line arguments, each as typed, to the argument's end
    (a password may hold spaces, quotes, ',' or '#', and Hydra's parse errors quote the
    argument back): masked where they appear whole, and by position elsewhere."""
    return [m.group(0).rstrip("'\"") for arg in args if (m := _ARG_URL.search(arg))]


def mask_passwords(text: str, urls: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every URL's password replaced by ***: the ``user:pw@`` field and the
    query's ``password=``, ``sslpassword=``, ``passfile=`` values, by their place in a URL,
    never by their text (a password ``p`` masked every p: ``***ostgres://u:***@localhost/h***o``).
    ``urls``: URLs as typed (url_passwords) whose password a word split may cut (a space in
    it): masked where they appear whole."""
    for url in sorted(urls, key=len, reverse=True):
        text = text.replace(url, _mask_whole(url))
    text = _PASSWORD_FILE.sub(r"\1***\2", text)
    return _QUERY_SECRET.sub(r"\1***", _mask_urls(text))


def _mask_whole(url: str) -> str:
    at = url.rfind("@")
    prefix = _URL_PREFIX.match(url, 0, at) if at >= 0 else None
    masked = url[:prefix.end()] + "***" + url[at:] if prefix is not None else url
    return _QUERY_SECRET.sub(r"\1***", masked)


def _mask_urls(text: str) -> str:
    """In each word, from its first ``scheme://user:`` to its last '@': the password."""
    words = _SPACES.split(text)
    for i in range(0, len(words), 2):  # the words; the odd items are the spaces between
        at = words[i].rfind("@")
        prefix = _URL_PREFIX.search(words[i], 0, at) if at >= 0 else None
        if prefix is not None:
            words[i] = words[i][:prefix.end()] + "***" + words[i][at:]
    return "".join(words)


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


class Absent(HpoError):
    """What a read command looks for is not there yet: no database, no study in it, or none of
    that name. An error like its kin (exit 2); ``status --watch`` started before the run that
    makes it waits for it instead."""


class NoDatabase(StorageError, Absent):
    """No database at the URL yet (a sqlite file not created, a database without tables)."""


class NoStudy(ConfigError, Absent):
    """The storage has no study, or none of the name asked for."""


class RuntimeFailure(HpoError):
    """The run started but could not go on (exit 1)."""

    exit_code = 1
