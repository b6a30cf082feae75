"""``trial.study`` inside a child: the read side of Optuna's ``Study``, and one clear error for
the rest.

Code written for Optuna reads the study from the trial: optuna-integration's LightGBM and
XGBoost pruning callbacks check ``trial.study.direction`` against the metric's, its MLflow
callback reads the direction and the study's name. A child never opens the storage
(docs/DESIGN.md §3.3), so the name and directions come with the Job, and the attrs are asked
of the orchestrator when read (they may change while the trial runs). Driving the study
(``optimize``, ``ask``, ``tell``, ``enqueue_trial``...) belongs to the orchestrator: those
raise :class:`NotInTrialProcess`, which names the limitation instead of a bare AttributeError.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.study import StudyDirection

# Optuna is imported when a trial object is built, not with this module: ``import
# hpo_orchestrator`` (phase, slot_info) stays light for the objective's own scripts.

__all__ = ["NotInTrialProcess", "StudyView", "not_available"]

_STUDY_READS = ("direction", "directions", "study_name", "user_attrs", "system_attrs")
_TRIAL_READS = ("study", "number", "params", "distributions", "user_attrs", "datetime_start",
                "relative_params")


class NotInTrialProcess(AttributeError):
    """A member of Optuna's Trial or Study that cannot work in a trial's child process.

    An AttributeError, so ``getattr(trial, name, default)`` and ``hasattr`` behave as for
    any missing attribute; the message says why it is missing and what is there instead.
    """


def not_available(owner: str, name: str) -> NotInTrialProcess:
    reads = _STUDY_READS if owner == "trial.study" else _TRIAL_READS
    return NotInTrialProcess(
        f"{owner}.{name} is not available in an orchestrated trial: the objective runs in a "
        "child process, and only the orchestrator asks, tells and optimizes the study (its "
        "storage is never opened here). The trial offers suggest_*, report, should_prune, "
        f"set_user_attr and {', '.join(reads)} (README, 'What `trial` offers inside a run').")


@cache
def _study_members() -> frozenset[str]:
    """Members of Optuna's Study that exist but cannot work here (a name outside it is a
    plain AttributeError: a typo should read as one)."""
    import optuna

    return frozenset(n for n in dir(optuna.study.Study) if not n.startswith("__")) | {
        "_storage", "_study_id", "sampler", "pruner"}


class StudyView:
    """What ``trial.study`` answers in a child: name and directions from the Job, attrs from
    the orchestrator (``read`` is the proxy's call for a READ_CALLS name)."""

    def __init__(self, study_name: str, directions: tuple[str, ...],
                 read: Callable[[str], Any]) -> None:
        from optuna.study import StudyDirection

        self._name = study_name
        self._directions = [StudyDirection[d.upper()] for d in directions]
        self._read = read

    @property
    def study_name(self) -> str:
        return self._name

    @property
    def directions(self) -> list[StudyDirection]:
        return list(self._directions)

    @property
    def direction(self) -> StudyDirection:
        if len(self._directions) > 1:  # Optuna's own error, word for word
            raise RuntimeError(
                "A single direction cannot be retrieved from a multi-objective study. Consider "
                "using Study.directions to retrieve a list containing all directions.")
        return self._directions[0]

    @property
    def user_attrs(self) -> dict[str, Any]:
        return dict(self._read("study.user_attrs"))

    @property
    def system_attrs(self) -> dict[str, Any]:
        return dict(self._read("study.system_attrs"))

    def _is_multi_objective(self) -> bool:
        return len(self._directions) > 1

    def __getattr__(self, name: str) -> Any:
        if name in _study_members():
            raise not_available("trial.study", name)
        raise AttributeError(f"'StudyView' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"StudyView(study_name={self._name!r})"
