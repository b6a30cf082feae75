"""``hpo-orchestrator telemetry --csv FILE``: the samples of a study (or one trial) as CSV."""

from __future__ import annotations

import csv
import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import IO

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from hpo_orchestrator.errors import ConfigError, StorageError
from hpo_orchestrator.status._queries import study_id_of
from hpo_orchestrator.tables import TELEMETRY_COLUMNS

__all__ = ["export_csv"]


def export_csv(engine: Engine, study: str | None, trial_number: int | None, out: str) -> int:
    """Write the samples to ``out`` ('-' for stdout); returns the number of rows.

    A file is written to a temporary name and renamed, so an error never leaves half a CSV.
    """
    with engine.connect() as connection:
        study_id, name = study_id_of(connection, study)
        if not inspect(connection).has_table("hpo_telemetry"):
            raise StorageError(f"study {name!r} has no telemetry (no hpo_telemetry table)",
                               "it was run without hpo-orchestrator, or with telemetry.enabled=false")
        if trial_number is not None and connection.execute(text(
                "SELECT 1 FROM trials WHERE study_id = :s AND number = :n"),
                {"s": study_id, "n": trial_number}).first() is None:
            raise ConfigError(f"study {name!r} has no trial {trial_number}",
                              "trial numbers start at 0; see 'hpo-orchestrator status'")
        columns = ", ".join(f"h.{c}" for c in TELEMETRY_COLUMNS)
        rows = connection.execute(text(
            f"SELECT t.number, {columns} FROM hpo_telemetry h JOIN trials t "
            "ON t.trial_id = h.trial_id WHERE t.study_id = :s"
            + (" AND t.number = :n" if trial_number is not None else "")
            + " ORDER BY h.ts, t.number"), {"s": study_id, "n": trial_number}).all()

    def write(handle: IO[str]) -> None:
        writer = csv.writer(handle)
        writer.writerow(["trial_number", *TELEMETRY_COLUMNS])
        for row in rows:
            writer.writerow(["" if v is None else (v.isoformat(sep=" ") if isinstance(v, datetime) else v)
                             for v in row])

    if out == "-":
        write(sys.stdout)
        return len(rows)
    target = Path(out)
    if not target.parent.is_dir():
        raise ConfigError(f"folder {target.parent} does not exist", "create it or choose another --csv path")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            write(handle)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(rows)
