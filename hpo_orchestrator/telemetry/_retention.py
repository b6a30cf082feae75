"""When to downsample old trials' samples (telemetry.keep_full_s, telemetry.max_rows_per_trial).

The orchestrator's loop calls :meth:`TelemetryRetention.maybe_run` after writing samples; it
does a pass at most every ``keep_full_s / 2`` (between 1 s and 10 min), and one at the end of
the run. A pass looks only at this host's trials that ended since the last pass (a cursor on
their end time), at most _BATCH at a time, so its cost does not grow with the study. The
rules and the SQL: hpo_orchestrator/db/_retention.py.
"""

from __future__ import annotations

import time

from sqlalchemy.engine import Engine

from hpo_orchestrator.db import RetentionRaced, downsample_trial, retention_candidates

__all__ = ["TelemetryRetention"]

_BATCH = 200  # trials looked at per pass


class TelemetryRetention:
    def __init__(self, engine: Engine, study_id: int, host: str, keep_full_s: float,
                 max_rows: int) -> None:
        self.engine = engine
        self.study_id = study_id
        self.host = host
        self.keep_full_s = keep_full_s
        self.max_rows = max_rows
        self.every_s = min(600.0, max(1.0, keep_full_s / 2))
        self._since = 0.0  # end time (epoch s) of the last trial looked at
        self._since_id = -1  # and its id: trials that ended at the same time come after it
        self._ran_at = time.monotonic()
        self.downsampled = 0  # trials downsampled by this run

    def maybe_run(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._ran_at < self.every_s:
            return
        self._ran_at = now
        cutoff = time.time() - self.keep_full_s
        with self.engine.connect() as connection:
            trials = retention_candidates(connection, self.study_id, self.host, self._since,
                                          cutoff, _BATCH, after=self._since_id)
        for trial_id, end_s in trials:
            try:
                with self.engine.begin() as connection:
                    self.downsampled += downsample_trial(connection, trial_id, self.max_rows)
            except RetentionRaced:
                pass  # another orchestrator did it (rolled back here)
            self._since, self._since_id = end_s, trial_id
