"""Optuna's storage calls that MirrorStorage (study/_storage.py) passes through to its
``RDBStorage``: the study-level ones and the heartbeats. Study names and directions never
change, so they are looked up once (Hyperband builds a Study per pruning decision, which
looks its name up each time).

Every call that reaches the database is declared :func:`~hpo_orchestrator.db.retried`: once a
run starts retrying (``MirrorStorage.start_retrying``), transient storage trouble in it is
waited out for ``storage.retry_s``; the Optuna calls it makes inside are retried with it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna._typing import JSONSerializable
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial

from hpo_orchestrator.db import Retrying, retried

__all__ = ["PassThroughStorage"]


class PassThroughStorage(BaseStorage, BaseHeartbeat):
    """The calls that go to ``backend`` as they are; the trial-level ones are the subclass's."""

    def __init__(self, backend: RDBStorage) -> None:
        self.backend = backend
        self.retrying: Retrying | None = None  # set when a run starts retrying (db/_retry.py)
        self._ids_by_name: dict[str, int] = {}
        self._directions: dict[int, list[StudyDirection]] = {}

    @property
    def engine(self) -> Any:
        return self.backend.engine

    @retried
    def create_new_study(self, directions: Sequence[StudyDirection],
                         study_name: str | None = None) -> int:
        return self.backend.create_new_study(directions, study_name)

    @retried
    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.backend.set_study_user_attr(study_id, key, value)

    @retried
    def set_study_system_attr(self, study_id: int, key: str, value: JSONSerializable) -> None:
        self.backend.set_study_system_attr(study_id, key, value)

    @retried
    def get_study_id_from_name(self, study_name: str) -> int:
        if study_name not in self._ids_by_name:
            self._ids_by_name[study_name] = self.backend.get_study_id_from_name(study_name)
        return self._ids_by_name[study_name]

    @retried
    def get_study_name_from_id(self, study_id: int) -> str:
        return self.backend.get_study_name_from_id(study_id)

    @retried
    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        if study_id not in self._directions:
            self._directions[study_id] = self.backend.get_study_directions(study_id)
        return self._directions[study_id]

    @retried
    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_user_attrs(study_id)

    @retried
    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_system_attrs(study_id)

    @retried
    def get_all_studies(self) -> list[FrozenStudy]:
        return self.backend.get_all_studies()

    @retried
    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self.backend.get_best_trial(study_id)

    # --- heartbeats: Optuna's, on the database -------------------------------------------

    @retried
    def record_heartbeat(self, trial_id: int) -> None:
        self.backend.record_heartbeat(trial_id)

    @retried
    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return self.backend._get_stale_trial_ids(study_id)

    def get_heartbeat_interval(self) -> int | None:
        return self.backend.get_heartbeat_interval()

    def get_heartbeat_stale_trial_callback(
            self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self.backend.get_heartbeat_stale_trial_callback()
