"""A trial's end as a value, and the writes of a running trial that Optuna would spread over
many transactions.

The orchestrator builds a :class:`TrialEnd` (scheduler/_writes.py), stages it on the run's
storage and calls Optuna's ``tell`` (so samplers and pruners see every trial as Optuna tells
it); the storage writes the end in the transaction that finishes the trial (:func:`write_end`,
from ``MirrorStorage.set_trial_state_values``): its attrs and true end time, the summary row,
the telemetry samples kept back, the retry and the tally's fold commit together or not at all.
Nothing calls back into the scheduler: the value says all the transaction does.

Optuna writes each reported value, each user attr and the final state in a transaction of its
own (10 reports: 10 commits). The run's storage keeps a running trial's reports in memory for
up to ``storage.refresh_s`` and writes them together (:func:`write_steps`); at the trial's end
its last reports, its attrs, its value and its state go in one transaction (:func:`write_end`),
so a trial is told completely or not at all (a crash before the commit leaves it RUNNING, and
heartbeats reap it). docs/BENCHMARKS.md "Large studies". Rows are Optuna's own
representation, written through Optuna's table definitions (the state and value-type columns
are enums on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from hpo_orchestrator.db import SummaryRow, enqueue_waiting_trial, state_name
from hpo_orchestrator.db.tables import insert_samples, insert_summary
from hpo_orchestrator.tally import advance_tally

__all__ = ["Requeue", "TrialEnd", "write_end", "write_param", "write_steps"]

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
    fold_tally: bool = False  # the study's tally takes the trials ended since (tally/_tally.py)


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
        advance_tally(connection, end.study_id, end.study_name)
    insert_samples(connection, list(end.samples))
    if end.retry is not None:
        enqueue_waiting_trial(connection, end.study_id, dict(end.retry.params),
                              dict(end.retry.user_attrs))


_trials = models.TrialModel.__table__
_values = models.TrialValueModel.__table__
_steps = models.TrialIntermediateValueModel.__table__
_attrs = models.TrialUserAttributeModel.__table__
_params = models.TrialParamModel.__table__


def _state_for_update(connection: Connection, trial_id: int) -> str | None:
    """The trial's state, its row locked until the transaction ends (PostgreSQL; sqlite's
    write lock serializes writers anyway)."""
    row = connection.execute(select(_trials.c.state).where(_trials.c.trial_id == trial_id)
                             .with_for_update()).first()
    return None if row is None else state_name(row[0].name if isinstance(row[0], TrialState)
                                               else row[0])


def _lock_unfinished(connection: Connection, trial_id: int) -> None:
    """Lock the trial's row for this transaction; as Optuna: KeyError if there is none,
    UpdateFinishedTrialError if it is already finished."""
    state = _state_for_update(connection, trial_id)
    if state is None:
        raise KeyError(f"no trial with id {trial_id}")
    if TrialState[state].is_finished():
        raise optuna.exceptions.UpdateFinishedTrialError(
            f"trial {trial_id} is already finished ({state})")


def write_param(connection: Connection, trial_id: int, name: str, value_internal: float,
                distribution: BaseDistribution) -> None:
    """A suggested param of a RUNNING trial, as Optuna's ``_set_trial_param`` writes it (the
    caller has checked the distribution against the study's), in two statements where its
    ORM session takes about 3 ms. UpdateFinishedTrialError once the trial is finished."""
    _lock_unfinished(connection, trial_id)
    connection.execute(insert(_params).values(
        trial_id=trial_id, param_name=name, param_value=value_internal,
        distribution_json=distribution_to_json(distribution)))


def write_steps(connection: Connection, trial_id: int, steps: Mapping[int, float]) -> bool:
    """Intermediate values of a RUNNING trial (replacing the same steps); False, and nothing
    written, when the trial is no longer RUNNING (another orchestrator reaped it)."""
    if not steps or _state_for_update(connection, trial_id) != "RUNNING":
        return False
    _write_steps(connection, trial_id, steps)
    return True


def _write_steps(connection: Connection, trial_id: int, steps: Mapping[int, float]) -> None:
    connection.execute(delete(_steps).where(_steps.c.trial_id == trial_id,
                                            _steps.c.step.in_(list(steps))))
    rows = []
    for step, value in steps.items():
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
        rows.append({"trial_id": trial_id, "step": step, "intermediate_value": stored,
                     "intermediate_value_type": kind})
    connection.execute(insert(_steps), rows)


def finish_trial(connection: Connection, trial_id: int, state: TrialState,
                 values: Sequence[float] | None, steps: Mapping[int, float],
                 attrs: Mapping[str, Any], ended: datetime) -> None:
    """The trial's pending reports, user attrs, values and final state, within the caller's
    transaction. Like Optuna: UpdateFinishedTrialError if it is already finished."""
    _lock_unfinished(connection, trial_id)
    if steps:
        _write_steps(connection, trial_id, steps)
    if attrs:
        connection.execute(delete(_attrs).where(_attrs.c.trial_id == trial_id,
                                                _attrs.c.key.in_(list(attrs))))
        connection.execute(insert(_attrs), [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in attrs.items()])
    if values is not None:
        connection.execute(delete(_values).where(_values.c.trial_id == trial_id))
        rows = []
        for objective, value in enumerate(values):
            stored, kind = models.TrialValueModel.value_to_stored_repr(value)
            rows.append({"trial_id": trial_id, "objective": objective, "value": stored,
                         "value_type": kind})
        connection.execute(insert(_values), rows)
    connection.execute(update(_trials).where(_trials.c.trial_id == trial_id)
                       .values(state=state, datetime_complete=ended))
