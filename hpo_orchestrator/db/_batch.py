"""A trial's end in one transaction, and its intermediate values written in batches
(study/_storage.py, docs/BENCHMARKS.md "Large studies").

Optuna writes each reported value, each user attr and the final state in a transaction of its
own (10 reports: 10 commits). Here the run loop's storage keeps a running trial's reports in
memory for up to ``storage.refresh_s`` and writes them together; at the trial's end its last
reports, its attrs, its value and its state go in one transaction, so a trial is told
completely or not at all (a crash before the commit leaves it RUNNING, and heartbeats reap it).

Rows are Optuna's own representation, written through Optuna's table definitions (the state
and value-type columns are enums on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from hpo_orchestrator.db._study import state_name

__all__ = ["finish_trial", "write_param", "write_steps"]

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
