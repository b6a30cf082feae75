"""A trial's end as a value: what its tell writes besides its state and values.

The orchestrator builds a :class:`TrialEnd` (scheduler/_records.py), stages it on the run's
storage and calls Optuna's ``tell`` (so samplers and pruners see every trial as Optuna tells
it); the storage writes the end in the transaction that finishes the trial (:func:`write_end`,
from ``MirrorStorage.set_trial_state_values``): its attrs and true end time, the summary row,
the telemetry samples kept back, the retry and the tally's fold commit together or not at all.
Nothing calls back into the scheduler: the value says all the transaction does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from optuna.trial import TrialState
from sqlalchemy.engine import Connection

from hpo_orchestrator.db import (
    SummaryRow,
    enqueue_waiting_trial,
    finish_trial,
    insert_samples,
    insert_summary,
)
from hpo_orchestrator.study._tally import advance

__all__ = ["Requeue", "TrialEnd", "write_end"]


@dataclass(frozen=True)
class Requeue:
    """The WAITING trial that retries this one (its params, its ``hpo.retry_*`` attrs)."""

    params: Mapping[str, Any]
    user_attrs: Mapping[str, Any]


@dataclass(frozen=True)
class TrialEnd:
    """Everything a trial's end writes beside its state and values, for the study
    ``study_id`` (named ``study_name``, for the tally)."""

    study_id: int
    study_name: str
    attrs: Mapping[str, Any] = field(default_factory=dict)  # hpo.* attrs of the end
    ended: datetime | None = None  # when its result came (None: now, as Optuna stamps tell)
    summary: SummaryRow | None = None  # its hpo_trial_summary row
    samples: Sequence[dict[str, Any]] = ()  # telemetry rows kept back until now
    retry: Requeue | None = None  # enqueued with it: the hpo.retried mark and the retry agree
    fold_tally: bool = False  # the study's tally takes the trials ended since (study/_tally.py)


def write_end(connection: Connection, trial_id: int, state: TrialState,
              values: Sequence[float] | None, steps: Mapping[int, float],
              end: TrialEnd | None) -> None:
    """The trial's last reports, attrs, values and state, then the rest of ``end``, within
    the caller's transaction. Like Optuna: UpdateFinishedTrialError if it is already finished."""
    finish_trial(connection, trial_id, state, values, steps, dict(end.attrs) if end else {},
                 (end.ended if end else None) or datetime.now())
    if end is None:
        return
    if end.summary is not None:
        insert_summary(connection, end.summary)
    if end.fold_tally:
        advance(connection, end.study_id, end.study_name)
    insert_samples(connection, list(end.samples))
    if end.retry is not None:
        enqueue_waiting_trial(connection, end.study_id, dict(end.retry.params),
                              dict(end.retry.user_attrs))
