"""The run loop's storage: Optuna's RDBStorage for every write, an in-memory mirror of the
study for the reads that samplers and pruners make (docs/BENCHMARKS.md "Large studies").

Why: Optuna wraps RDBStorage in ``_CachedStorage``, whose first ``get_all_trials`` loads every
trial of the study through the ORM (170 s at 100,000 trials), and whose ``ask()`` scans the
WAITING trials, reads the new trial back and looks the study up again per pruning decision.
Here:

- reads come from the mirror, loaded once with bulk SQL (study/_mirror.py: one
  statement per table) and refreshed incrementally: trials above the highest id seen, and the
  ones the mirror holds unfinished (RUNNING, WAITING), at most every ``refresh_s`` seconds;
  so another orchestrator's trials reach the sampler within ``refresh_s`` of its ask;
- writes go to RDBStorage first (durable, in Optuna's own representation, before the call
  returns) and are then applied to the mirror, so this process sees its own writes at once;
- a running trial's reports are written in batches (at most ``refresh_s`` late: pruning
  reads them from the mirror at once), and its end (last reports, value, state and the
  ``TrialEnd`` the orchestrator staged: study/_end.py) in one transaction: a trial is told
  completely or not at all;
- the history is bounded: with ``max_history=N`` the sampler and pruner see the N newest
  trials plus the ``keep_best`` best COMPLETE ones (and any unfinished trial), never the whole
  study, so ask/tell cost stays flat as the study grows. ``max_history=None``: every trial.

Samplers and pruners see a ``FrozenTrial`` exactly as Optuna's storage builds it. Trials the
orchestrator updates behind the storage API (its ``hpo.*`` attrs, through hpo_orchestrator.db)
reach the mirror with the next refresh; no sampler or pruner reads them.

Storage trouble: a method that reaches the database is ``@retried`` (db/_retry.py): after
:meth:`MirrorStorage.start_retrying`, transient trouble in it is waited out and the call runs
again; ``NOT_RETRIED`` names the rest and why (tests/study/test_storage_retries.py). Thread safety:
one lock around the mirror; the orchestrator's loop is its one caller.
"""

from __future__ import annotations

import bisect
import copy
import threading
import time
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

import optuna
from optuna._typing import JSONSerializable
from optuna.distributions import BaseDistribution, check_distribution_compatibility
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial, TrialState

from hpo_orchestrator.db import Retrying, ask_running_trial, record_heartbeat, retried
from hpo_orchestrator.study._end import TrialEnd, write_end, write_param, write_steps
from hpo_orchestrator.study._mirror import (
    StudyMirror,
    best_trial_ids,
    by_number,
    callers_copy,
    new_running_trial,
    read_trials,
    recent_trial_ids,
    unfinished_trial_ids_before,
)

__all__ = ["MirrorStorage"]



class PassThroughStorage(BaseStorage, BaseHeartbeat):
    """The calls that go to ``backend`` as they are: the study-level ones and the heartbeats;
    the trial-level ones are MirrorStorage's. Study names and directions never change, so they
    are looked up once (Hyperband builds a Study per pruning decision, which looks its name up
    each time). Every call that reaches the database is declared :func:`~hpo_orchestrator.db.retried`."""

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
        """Stamped when written (db/_run_io.py), where Optuna's is stamped before its lock wait."""
        with self.backend.engine.begin() as connection:
            record_heartbeat(connection, trial_id)

    @retried
    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return self.backend._get_stale_trial_ids(study_id)

    def get_heartbeat_interval(self) -> int | None:
        return self.backend.get_heartbeat_interval()

    def get_heartbeat_stale_trial_callback(
            self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self.backend.get_heartbeat_stale_trial_callback()


class MirrorStorage(PassThroughStorage):
    """``BaseStorage`` over an ``RDBStorage``: writes through, reads from a mirror.

    ``max_history``: newest trials the sampler sees (None: all); ``keep_best``: best COMPLETE
    trials it sees beyond them; ``refresh_s``: the longest a read serves the mirror without
    looking for other processes' trials. Optuna does not wrap it again (it wraps only a bare
    RDBStorage), so ``optuna.create_study(storage=MirrorStorage(...))`` uses it as it is.
    """

    # Public methods that are not retried steps of their own, and why (the others are @retried).
    NOT_RETRIED: ClassVar[dict[str, str]] = {
        "starting": "no database: marks the trials ask() creates (create_new_trial writes)",
        "stage_end": "no database: kept for the tell (set_trial_state_values writes)",
        "refresh_soon": "no database: the next read refreshes",
        "start_retrying": "no database: starts the retries",
        "held_trials": "no database: the mirror's trials, when the database is gone",
        "get_heartbeat_interval": "no database: the backend's setting",
        "get_heartbeat_stale_trial_callback": "no database: the backend's setting",
        "get_failed_trial_callback": "BaseHeartbeat's: the backend's setting, no database",
        "check_trial_is_updatable": "BaseStorage's: no database, a FrozenTrial's state",
        "remove_session": "BaseStorage's: does nothing",
        "get_n_trials": "BaseStorage's: reads through get_all_trials (retried)",
        "get_trial_number_from_id": "BaseStorage's: reads through get_trial (retried)",
        "get_trial_param": "BaseStorage's: reads through get_trial (retried)",
        "get_trial_params": "BaseStorage's: reads through get_trial (retried)",
        "get_trial_user_attrs": "BaseStorage's: reads through get_trial (retried)",
        "get_trial_system_attrs": "BaseStorage's: reads through get_trial (retried)",
    }

    def __init__(self, backend: RDBStorage, *, max_history: int | None = None,
                 keep_best: int = 100, refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(backend)
        self.max_history = max_history
        self.keep_best = keep_best
        self.refresh_s = refresh_s
        self._clock = clock
        self._studies: dict[int, StudyMirror] = {}
        self._trial_study: dict[int, int] = {}  # trial id -> study id, for the trials mirrored
        self._lock = threading.RLock()
        self._pending: dict[int, dict[int, float]] = {}  # trial id -> reports not yet written
        self._flushed_at = clock()
        self._ends: dict[int, TrialEnd] = {}
        self._starting: tuple[dict[str, Any], set[int]] | None = None  # see starting()
        self._asking: datetime | None = None  # the start of an ask whose try raised

    def start_retrying(self, retry_s: float) -> Retrying:
        """From here on, transient storage trouble in a call (``@retried``) is waited out for
        ``retry_s`` seconds; returns the retrier, for the run's own steps to share."""
        self.retrying = Retrying(retry_s, self.backend.engine.dialect.name)
        return self.retrying

    # --- studies: through to the database (_passthrough.py), but the mirror's ---------------

    @retried
    def delete_study(self, study_id: int) -> None:
        with self._lock:
            self._studies.pop(study_id, None)
            self._directions.pop(study_id, None)
            self._ids_by_name = {k: v for k, v in self._ids_by_name.items() if v != study_id}
        self.backend.delete_study(study_id)

    # --- trial writes: the database first, then the mirror ----------------------------------

    @contextmanager
    def starting(self, attrs: dict[str, Any]) -> Iterator[set[int]]:
        """While open, a trial that ask() creates gets the user ``attrs`` and its first
        heartbeat in the transaction that inserts it (Optuna's API: a transaction each); its
        id joins the set yielded. A WAITING trial that ask() takes instead gets neither."""
        created: set[int] = set()
        self._starting = (dict(attrs), created)
        try:
            yield created
        finally:
            self._starting = None

    @retried
    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        mirror = self._mirror(study_id)
        if template_trial is None:  # every ask(): numbered without counting the study
            retry, started = self._asking is not None, self._asking or datetime.now()  # local
            attrs, created = self._starting or ({}, set())
            self._asking = started  # a try that raises may have committed: the next one looks
            with self.backend.engine.begin() as connection:
                frozen = new_running_trial(*ask_running_trial(
                    connection, study_id, started, None if self._starting is None else attrs,
                    self._trial_study if retry else None), started, attrs)
            self._asking = None
            created.add(frozen._trial_id)
        else:  # enqueue_trial, add_trial: rare, Optuna's own
            frozen = self.backend._create_new_trial(study_id, template_trial)
        with self._lock:
            mirror.put(frozen)
            self._trial_study[frozen._trial_id] = study_id
        return frozen._trial_id

    @retried
    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: BaseDistribution) -> None:
        mirror, trial = self._mirrored(trial_id)
        known = mirror.distributions.get(param_name) if mirror is not None else None
        if known is None:  # Optuna's: it checks the name against the study's trials
            self.backend._set_trial_param(trial_id, param_name, param_value_internal,
                                          distribution, None)
        else:  # checked here, as Optuna's cache does; the row written without its ORM
            check_distribution_compatibility(known, distribution)
            with self.backend.engine.begin() as connection:
                write_param(connection, trial_id, param_name, param_value_internal, distribution)
        if mirror is not None and trial is not None:
            with self._lock:
                trial = copy.copy(trial)
                trial._params = {**trial.params,
                                 param_name: distribution.to_external_repr(param_value_internal)}
                trial._distributions = {**trial.distributions, param_name: distribution}
                mirror.put(trial)

    def stage_end(self, trial_id: int, end: TrialEnd) -> None:
        """What the transaction that finishes the trial (its ``tell``) writes besides its
        state and values (study/_end.py); kept until that transaction commits."""
        self._ends[trial_id] = end

    @retried
    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        mirror, trial = self._mirrored(trial_id)
        if state.is_finished():
            changed = self._finish(trial_id, state, values, mirror)
        else:
            try:
                changed = self.backend.set_trial_state_values(trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if mirror is not None:
                    mirror.refreshed_at = -float("inf")  # finished elsewhere: read it again
                raise
        if mirror is None or trial is None:
            return changed
        with self._lock:
            trial = copy.copy(trial)
            if not changed:  # a WAITING trial another process took first
                trial.state = TrialState.RUNNING
            else:
                trial.state = state
                if values is not None:
                    trial.values = list(values)
                now = datetime.now()  # as Optuna stamps it; the database holds its own copy
                if state == TrialState.RUNNING:
                    trial.datetime_start = now
                if state.is_finished():
                    trial.datetime_complete = now
            mirror.put(trial)
        return changed

    def _finish(self, trial_id: int, state: TrialState, values: Sequence[float] | None,
                mirror: StudyMirror | None) -> bool:
        # Kept until the transaction commits: a storage error leaves them for the retry
        # (set_trial_state_values is @retried: the call runs again).
        steps = self._pending.get(trial_id, {})
        try:
            with self.backend.engine.begin() as connection:
                write_end(connection, trial_id, state, values, steps, self._ends.get(trial_id))
        except optuna.exceptions.UpdateFinishedTrialError:
            self._ends.pop(trial_id, None)
            self._pending.pop(trial_id, None)
            if mirror is not None:
                mirror.refreshed_at = -float("inf")  # finished elsewhere: read it again
            raise
        self._ends.pop(trial_id, None)
        self._pending.pop(trial_id, None)
        return True

    @retried
    def set_trial_intermediate_value(self, trial_id: int, step: int,
                                     intermediate_value: float) -> None:
        _, trial = self._mirrored(trial_id)
        if trial is None or trial.state != TrialState.RUNNING:
            self.backend.set_trial_intermediate_value(trial_id, step, intermediate_value)
            return
        self._update(trial_id, "intermediate_values", step, intermediate_value)
        self._pending.setdefault(trial_id, {})[step] = intermediate_value
        if self._clock() - self._flushed_at >= self.refresh_s:
            self.flush()

    @retried
    def flush(self) -> None:
        """Write the reports kept back (one transaction); those of a trial that another
        process finished meanwhile are dropped, as Optuna would refuse them."""
        self._flushed_at = self._clock()
        pending, self._pending = self._pending, {}
        if pending:
            try:
                with self.backend.engine.begin() as connection:
                    for trial_id, steps in pending.items():
                        # A report is a sign of life: a trial lost with its orchestrator
                        # (kill -9) then ends no earlier than its last stored report, not at
                        # a heartbeat up to storage.heartbeat_interval_s before it
                        # (scheduler/_recovery.last_alive).
                        if write_steps(connection, trial_id, steps):
                            record_heartbeat(connection, trial_id)
            except Exception:  # kept for the retry (@retried), newer reports first
                for trial_id, steps in pending.items():
                    self._pending[trial_id] = {**steps, **self._pending.get(trial_id, {})}
                raise

    def refresh_soon(self, study_id: int) -> None:
        """The next read looks for new trials at once: one was written behind the storage
        API (a retry the orchestrator enqueued in the transaction of its failed attempt)."""
        mirror = self._studies.get(study_id)
        if mirror is not None:
            mirror.refreshed_at = -float("inf")

    @retried
    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.backend.set_trial_user_attr(trial_id, key, value)
        self._update(trial_id, "_user_attrs", key, value)

    @retried
    def set_trial_system_attr(self, trial_id: int, key: str, value: JSONSerializable) -> None:
        self.backend.set_trial_system_attr(trial_id, key, value)
        self._update(trial_id, "_system_attrs", key, value)

    def _update(self, trial_id: int, field: str, key: Any, value: Any) -> None:
        mirror, trial = self._mirrored(trial_id)
        if mirror is None or trial is None:
            return
        with self._lock:
            trial = copy.copy(trial)
            setattr(trial, field, {**getattr(trial, field), key: value})
            mirror.put(trial)

    # --- trial reads: from the mirror ----------------------------------------------------

    @retried
    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        mirror = self._studies.get(study_id)
        if mirror is not None:
            index = bisect.bisect_left(mirror.ordered, trial_number, key=by_number)
            if index < len(mirror.ordered) and mirror.ordered[index].number == trial_number:
                return mirror.ordered[index]._trial_id
        return self.backend.get_trial_id_from_study_id_trial_number(study_id, trial_number)

    @retried
    def get_trial(self, trial_id: int) -> FrozenTrial:
        _, trial = self._mirrored(trial_id)
        if trial is None:
            return self.backend.get_trial(trial_id)
        # Callers (optuna.Trial) change the unfinished trial they get: theirs is a copy.
        return trial if trial.state.is_finished() else callers_copy(trial)

    @retried
    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        mirror = self._refreshed(study_id)
        with self._lock:
            if isinstance(states, tuple) and states == (TrialState.WAITING,):
                # ask() scans for WAITING trials every time: only the unfinished are candidates.
                trials = sorted((mirror.by_id[i] for i in mirror.unfinished
                                 if mirror.by_id[i].state == TrialState.WAITING), key=by_number)
            else:
                if not mirror.history_loaded:
                    self._load_history(study_id, mirror)
                trials = mirror.view()
                if states is not None:
                    trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    @retried
    def unfinished_trial_ids(self, study_id: int) -> set[int]:
        """RUNNING and WAITING trials, any process's, as of at most ``refresh_s`` ago."""
        mirror = self._refreshed(study_id)  # the database read outside the lock
        with self._lock:
            return set(mirror.unfinished)

    def held_trials(self, study_id: int) -> list[FrozenTrial]:
        """The study's trials the mirror holds, read from nowhere else (the database may be
        gone: study/_lost.py)."""
        mirror = self._studies.get(study_id)
        with self._lock:
            return [] if mirror is None else copy.deepcopy(list(mirror.by_id.values()))

    # --- the mirror ----------------------------------------------------------------------

    def _mirrored(self, trial_id: int) -> tuple[StudyMirror | None, FrozenTrial | None]:
        study_id = self._trial_study.get(trial_id)
        mirror = self._studies.get(study_id) if study_id is not None else None
        return mirror, None if mirror is None else mirror.by_id.get(trial_id)

    def _mirror(self, study_id: int) -> StudyMirror:
        """The study's mirror, started on first use with its unfinished trials only."""
        mirror = self._studies.get(study_id)
        if mirror is not None:
            return mirror
        maximize = self.get_study_directions(study_id)[0] == StudyDirection.MAXIMIZE
        mirror = StudyMirror(maximize, self.max_history, self.keep_best)
        with self.backend.engine.connect() as connection, connection.begin():
            newest = recent_trial_ids(connection, study_id, 1)
            last = newest[0] if newest else -1
            unfinished = unfinished_trial_ids_before(connection, study_id, last + 1)
            trials = read_trials(connection, study_id, after=last, ids=unfinished)
        with self._lock:
            mirror.max_id = last  # everything older is history, read when needed
            self._put_read(study_id, mirror, trials)
            self._studies[study_id] = mirror
        return mirror

    def _refreshed(self, study_id: int) -> StudyMirror:
        mirror = self._mirror(study_id)
        if self._clock() - mirror.refreshed_at >= self.refresh_s:
            self._refresh(study_id, mirror)
        return mirror

    def _load_history(self, study_id: int, mirror: StudyMirror) -> None:
        """The window (all trials without a bound), the best trials older than it."""
        with self.backend.engine.connect() as connection, connection.begin():
            if self.max_history is None:
                trials = read_trials(connection, study_id, after=-1)
            else:
                recent = recent_trial_ids(connection, study_id, self.max_history)
                first = min(recent, default=0)
                best = best_trial_ids(connection, study_id, self.keep_best, mirror.maximize)
                trials = read_trials(connection, study_id, after=first - 1,
                                     ids={i for i in best if i < first})
        with self._lock:
            self._put_read(study_id, mirror, trials)
            mirror.history_loaded = True

    def _refresh(self, study_id: int, mirror: StudyMirror) -> None:
        """New trials (any process's) and the current state of the unfinished ones."""
        self.flush()  # else the reread of our running trials would lack their latest reports
        with self.backend.engine.connect() as connection, connection.begin():
            trials = read_trials(connection, study_id, after=mirror.max_id,
                                 ids=set(mirror.unfinished))
        with self._lock:
            self._put_read(study_id, mirror, trials)
            before = set(mirror.by_id)
            mirror.trim()
            for gone in before - set(mirror.by_id):
                self._trial_study.pop(gone, None)

    def _put_read(self, study_id: int, mirror: StudyMirror, trials: list[FrozenTrial]) -> None:
        for trial in trials:
            kept = self._pending.get(trial._trial_id)
            if kept:  # reports kept back (flush): the database's copy lacks them
                trial.intermediate_values = {**trial.intermediate_values, **kept}
            mirror.put(trial)
            self._trial_study[trial._trial_id] = study_id
            mirror.max_id = max(mirror.max_id, trial._trial_id)
        mirror.refreshed_at = self._clock()
