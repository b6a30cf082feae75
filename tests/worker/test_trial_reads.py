"""The trial stand-in reads like Optuna's Trial (issue 30, item 1): ``trial.study``'s
direction(s), name and attrs, the trial's number, params, distributions, user attrs, start
time and relative params, answered by a real ``optuna.Trial`` over a real pipe; what needs the
study's storage raises one error naming the limitation. Whole studies with optuna-integration's
callbacks: tests/worker/test_integration_callbacks.py."""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection

from hpo_orchestrator.scheduler import _calls
from hpo_orchestrator.scheduler._channel import Channel
from hpo_orchestrator.worker import NotInTrialProcess, TrialProxy
from hpo_orchestrator.worker._link import Link


class _Orchestrator:
    """The orchestrator's side for one trial: a real Optuna trial answers the proxy's calls
    through the same ``_calls._answer`` a run uses."""

    def __init__(self, directions: list[str]) -> None:
        self.study = optuna.create_study(study_name="reads", directions=directions,
                                         sampler=optuna.samplers.RandomSampler(seed=1))
        self.study.set_user_attr("owner", "team-a")
        self.study._storage.set_study_system_attr(self.study._study_id, "sys.k", 7)
        self.trial = self.study.ask()
        ours, theirs = socket.socketpair()
        self.channel, self.child = Channel(ours), Connection(theirs.detach())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        rt = SimpleNamespace(trial=self.trial, connection=self.channel, number=self.trial.number,
                             space=None)
        while not self._stop.is_set():
            for message in self.channel.receive():
                _, method, args, kwargs, tag = message
                _calls._answer(rt, method, args, kwargs, tag)  # type: ignore[arg-type]
            self.channel.flush()
            self._stop.wait(0.001)

    def proxy(self) -> TrialProxy:
        link = Link(self.child)
        link.open_trial(self.trial.number)
        return TrialProxy(link, self.trial.number, study_name="reads",
                          directions=tuple(d.name.lower() for d in self.study.directions),
                          datetime_start=self.trial.datetime_start)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.channel.close()
        self.child.close()


@pytest.fixture
def orchestrator() -> Iterator[_Orchestrator]:
    served = _Orchestrator(["maximize"])
    yield served
    served.close()


def test_the_stand_in_reads_as_optunas_trial(orchestrator: _Orchestrator) -> None:
    trial = orchestrator.proxy()
    x = trial.suggest_float("x", 0.0, 1.05, step=0.1)  # Optuna adjusts high to 1.0
    n = trial.suggest_int("n", 1, 64, log=True)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    trial.set_user_attr("my.note", "hi")
    real = orchestrator.trial
    assert trial.number == real.number == 0
    assert trial.params == real.params == {"x": x, "n": n, "kind": kind}
    assert trial.distributions == real.distributions == {
        "x": FloatDistribution(0.0, 1.0, step=0.1), "n": IntDistribution(1, 64, log=True),
        "kind": CategoricalDistribution(["a", "b"])}
    assert trial.user_attrs == {"my.note": "hi"}
    assert isinstance(trial.datetime_start, datetime.datetime)
    assert trial.datetime_start == real.datetime_start
    assert trial.relative_params == real.relative_params == {}  # RandomSampler: none
    study = trial.study
    assert study.direction == StudyDirection.MAXIMIZE and study.directions == [StudyDirection.MAXIMIZE]
    assert study.study_name == "reads"
    assert study.user_attrs == {"owner": "team-a"}
    assert study.system_attrs["sys.k"] == 7
    orchestrator.study.set_user_attr("later", 1)  # asked when read: a change shows
    assert study.user_attrs == {"owner": "team-a", "later": 1}


def test_a_multi_objective_study_answers_directions_and_refuses_direction_as_optuna() -> None:
    served = _Orchestrator(["minimize", "maximize"])
    try:
        study = served.proxy().study
        assert study.directions == [StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE]
        with pytest.raises(RuntimeError, match="multi-objective study"):
            _ = study.direction
        with pytest.raises(RuntimeError, match="multi-objective study"):
            _ = served.study.direction  # Optuna's own, for comparison
    finally:
        served.close()


@pytest.mark.parametrize("owner, name", [
    ("study", "optimize"), ("study", "tell"), ("study", "ask"), ("study", "enqueue_trial"),
    ("study", "trials"), ("study", "best_trial"), ("study", "_storage"),
    ("trial", "storage"), ("trial", "_trial_id"), ("trial", "set_constraint"),
])
def test_what_needs_the_storage_raises_one_error_naming_the_limitation(
        orchestrator: _Orchestrator, owner: str, name: str) -> None:
    trial = orchestrator.proxy()
    target = trial.study if owner == "study" else trial
    where = "trial.study" if owner == "study" else "trial"
    with pytest.raises(NotInTrialProcess, match=rf"^{where}\.{name} is not available in an "
                       r"orchestrated trial: the objective runs in a child process"):
        getattr(target, name)
    assert getattr(target, name, "default") == "default"  # an AttributeError, as Optuna's absence
    with pytest.raises(AttributeError, match="no attribute 'sugest_float'") as typo:
        trial.sugest_float  # noqa: B018
    assert not isinstance(typo.value, NotInTrialProcess)  # a typo reads as one


def test_the_stand_in_leaves_optuna_unimported_until_a_trial_is_built() -> None:
    """``import hpo_orchestrator`` (phase, slot_info in the objective's own scripts) stays
    light: the stand-in imports Optuna when a trial object is built."""
    import subprocess
    import sys

    code = ("import sys, hpo_orchestrator, hpo_orchestrator.worker; "
            "print('optuna' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
