"""``hpo-orchestrator telemetry --csv FILE``: the samples of a study (or one trial) as CSV."""

from __future__ import annotations

import csv
import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import IO

from sqlalchemy.engine import Engine

from hpo_orchestrator import db
from hpo_orchestrator.errors import ConfigError, StorageError

__all__ = ["export_csv"]


def export_csv(engine: Engine, study: str | None, trial_number: int | None, out: str) -> int:
    """Write the samples to ``out`` ('-' for stdout); returns the number of rows.

    A file is written to a temporary name and renamed, so an error never leaves half a CSV.
    """
    with engine.connect() as connection:
        study_id, name = db.study_id_of(connection, study)
        if not db.has_telemetry_table(connection):
            raise StorageError(f"study {name!r} has no telemetry (no hpo_telemetry table)",
                               "it was run without hpo-orchestrator, or with telemetry.enabled=false")
        if trial_number is not None and not db.has_trial(connection, study_id, trial_number):
            raise ConfigError(f"study {name!r} has no trial {trial_number}",
                              "trial numbers start at 0; see 'hpo-orchestrator status'")
        rows = db.telemetry_rows(connection, study_id, trial_number)

    def write(handle: IO[str]) -> None:
        writer = csv.writer(handle)
        writer.writerow(["trial_number", *db.TELEMETRY_COLUMNS])
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
