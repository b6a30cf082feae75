"""Which Optuna schema a database has, checked when it is opened.

The db package reads and writes Optuna's tables with plain SQL (docs/DESIGN.md §3.2), so its
statements are written against one schema. Optuna records the schema as an alembic revision in
``alembic_version`` (and the Optuna version that set it up in ``version_info``); a database
made by an Optuna whose schema we do not know is refused at open with a hint, instead of
failing later in the middle of a statement (or of a run). tests/db/test_db_contract.py checks
that the installed Optuna writes :data:`SCHEMA_REVISION` and runs every statement against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo_orchestrator.db._sql import fetch_one, has_table, scalar
from hpo_orchestrator.errors import StorageError

if TYPE_CHECKING:
    from hpo_orchestrator.db._sql import Readable

__all__ = ["OLDER_REVISIONS", "SCHEMA_REVISION", "check_schema", "schema_of"]

# The alembic revision our statements are written and tested against (Optuna 3.2 to 5.0).
SCHEMA_REVISION = "v3.2.0.a"
# Optuna's earlier revisions: such a database can be upgraded with `optuna storage upgrade`.
OLDER_REVISIONS = ("v0.9.0.a", "v1.2.0.a", "v1.3.0.a", "v2.4.0.a", "v2.6.0.a", "v3.0.0.a",
                   "v3.0.0.b", "v3.0.0.c", "v3.0.0.d")
# version_info.schema_version since alembic took over; lower means made before alembic.
_ALEMBIC_SCHEMA_VERSION = 12

_REVISION_SQL = "SELECT version_num FROM alembic_version"
_VERSION_INFO_SQL = "SELECT schema_version, library_version FROM version_info"


def schema_of(connection: Readable) -> tuple[str | None, int | None, str | None]:
    """(alembic revision, version_info.schema_version, Optuna version that set it up); None
    for what the database does not have (yet: another process may be creating it)."""
    revision = scalar(connection, _REVISION_SQL) if has_table(connection, "alembic_version") else None
    info = fetch_one(connection, _VERSION_INFO_SQL) if has_table(connection, "version_info") else None
    return (None if revision is None else str(revision),
            None if info is None or info[0] is None else int(info[0]),
            None if info is None or info[1] is None else str(info[1]))


def check_schema(connection: Readable, shown_url: str) -> bool:
    """Raise StorageError (exit 2) unless the database is new or has :data:`SCHEMA_REVISION`;
    True when it has it (all of Optuna's tables are there: nothing for Optuna to create).

    ``shown_url`` is the URL as messages may show it (password masked).
    """
    if not has_table(connection, "studies"):
        return False  # a new database: the installed Optuna creates the schema we know
    revision, schema_version, made_by = schema_of(connection)
    if revision == SCHEMA_REVISION:
        return True
    if revision is None and (schema_version is None or schema_version == _ALEMBIC_SCHEMA_VERSION):
        return False  # Optuna is creating it right now (tables first, version_info, the stamp)
    by = f" (set up by optuna {made_by})" if made_by else ""
    if revision is None or revision in OLDER_REVISIONS:
        raise StorageError(
            f"{shown_url} has an older Optuna schema ({revision or f'version {schema_version}'}){by}",
            f"upgrade it first: optuna storage upgrade --storage '{shown_url}'")
    raise StorageError(
        f"{shown_url} has Optuna schema {revision}{by}, which this hpo-orchestrator does not know "
        f"(it reads {SCHEMA_REVISION})",
        "use an hpo-orchestrator made for that Optuna version, or another storage")
