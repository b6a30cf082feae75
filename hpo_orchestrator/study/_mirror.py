"""The trials of one study as the run loop's samplers and pruners see them (the data
structure behind study/_storage.py's MirrorStorage; no I/O here)."""

from __future__ import annotations

import bisect
import copy
from datetime import datetime
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

__all__ = ["StudyMirror", "by_number", "callers_copy", "new_running_trial"]


def by_number(trial: FrozenTrial) -> int:
    return trial.number


def new_running_trial(trial_id: int, number: int, started: datetime,
                      user_attrs: dict[str, Any] | None = None) -> FrozenTrial:
    """A trial just asked, as Optuna's storage hands it back from create_new_trial."""
    return FrozenTrial(number=number, state=TrialState.RUNNING, value=None, values=None,
                       datetime_start=started, datetime_complete=None, params={},
                       distributions={}, user_attrs=dict(user_attrs or {}), system_attrs={},
                       intermediate_values={}, trial_id=trial_id)


def callers_copy(trial: FrozenTrial) -> FrozenTrial:
    """A copy to change as optuna.Trial changes the trial it caches (it sets keys of its
    params, distributions, attrs and intermediate values): those dicts copied, their values
    shared (the mirror replaces a value, never changes one in place). copy.deepcopy cost
    0.15-0.5 ms a call, three calls a trial."""
    copied = copy.copy(trial)
    copied._params, copied._distributions = dict(trial._params), dict(trial._distributions)
    copied._user_attrs, copied._system_attrs = dict(trial._user_attrs), dict(trial._system_attrs)
    copied.intermediate_values = dict(trial.intermediate_values)
    return copied


class StudyMirror:
    """The trials of one study that the sampler sees, ordered by number."""

    def __init__(self, maximize: bool, max_history: int | None, keep_best: int) -> None:
        self.maximize = maximize
        self.max_history = max_history
        self.keep_best = keep_best
        self.by_id: dict[int, FrozenTrial] = {}
        self.ordered: list[FrozenTrial] = []
        self.unfinished: set[int] = set()
        self.best: list[FrozenTrial] = []  # the keep_best best COMPLETE trials
        # The highest trial id read from the database: every lower one has been read (or
        # was outside the window). Trials this process creates do not move it, since another
        # process's trial may have a lower id yet be unread.
        self.max_id = -1
        self.refreshed_at = -float("inf")
        self.distributions: dict[str, BaseDistribution] = {}
        # The history is read on the first read that needs it (a sampler's or pruner's), not
        # at start: asking a random trial needs only the WAITING ones.
        self.history_loaded = False

    def put(self, trial: FrozenTrial) -> None:
        old = self.by_id.get(trial._trial_id)
        self.by_id[trial._trial_id] = trial
        if old is not None:
            index = bisect.bisect_left(self.ordered, trial.number, key=by_number)
            self.ordered[index] = trial
        elif not self.ordered or self.ordered[-1].number < trial.number:
            self.ordered.append(trial)  # the usual case: a newer trial
        else:
            bisect.insort(self.ordered, trial, key=by_number)
        if trial.state.is_finished():
            self.unfinished.discard(trial._trial_id)
            if trial.state == TrialState.COMPLETE and trial.values:
                self._consider_best(trial)
        else:
            self.unfinished.add(trial._trial_id)
        for name, dist in trial.distributions.items():
            self.distributions.setdefault(name, dist)

    def _consider_best(self, trial: FrozenTrial) -> None:
        if self.keep_best <= 0:
            return
        sign = -1.0 if self.maximize else 1.0
        self.best = [t for t in self.best if t._trial_id != trial._trial_id]
        bisect.insort(self.best, trial, key=lambda t: sign * t.values[0])
        del self.best[self.keep_best:]

    def trim(self) -> None:
        """Forget finished trials older than the window that are not among the best (memory
        stays bounded; they are still in the database)."""
        if self.max_history is None or len(self.ordered) <= self.max_history * 5 // 4:
            return
        keep = {t._trial_id for t in self.best} | self.unfinished
        window = self.ordered[-self.max_history:]
        old = [t for t in self.ordered[:-self.max_history] if t._trial_id in keep]
        for t in self.ordered[:-self.max_history]:
            if t._trial_id not in keep:
                del self.by_id[t._trial_id]
        self.ordered = old + window

    def view(self) -> list[FrozenTrial]:
        """What the sampler sees: the window, the best older trials and unfinished ones."""
        if self.max_history is None or len(self.ordered) <= self.max_history:
            return list(self.ordered)
        window = self.ordered[-self.max_history:]
        first = window[0].number
        keep = {t._trial_id for t in self.best} | self.unfinished
        older = [t for t in self.ordered[:-self.max_history] if t._trial_id in keep]
        assert all(t.number < first for t in older)
        return older + window
