"""The reads behind ``best`` and status's Pareto front (db/_best.py): COMPLETE trials only
(a PRUNED trial keeps its last report as its value in Optuna's table, a RUNNING one has
none), every objective's value present (an infinite one is stored as NULL: such a trial can
be no one's best), the directions as the study has them."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpo_orchestrator import db
from hpo_orchestrator.db import connect

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _front(url: str, name: str) -> tuple[list[str], list[tuple[int, tuple[float, ...]]]]:
    engine = connect.create_engine(url)
    try:
        with engine.connect() as connection:
            study_id, _ = db.study_id_of(connection, name)
            directions, front = db.best_trials(connection, study_id)
    finally:
        engine.dispose()
    return directions, [(t.number, t.values) for t in front]


def test_the_front_leaves_out_unfinished_and_infinite_trials(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    study = optuna.create_study(storage=url, study_name="mo", directions=["minimize", "maximize"])
    study.tell(study.ask(), [1.0, 1.0])  # 0: on the front
    study.tell(study.ask(), [2.0, 3.0])  # 1: on the front
    study.tell(study.ask(), [math.inf, 10.0])  # 2: an infinite value: left out
    study.tell(study.ask(), [0.5, -math.inf])  # 3: left out
    study.ask()  # 4: RUNNING, no values
    study.tell(study.ask(), state=TrialState.FAIL)  # 5
    study.tell(study.ask(), [3.0, 0.5])  # 6: dominated by 1
    study.tell(study.ask(), [1.0, 1.0])  # 7: equal to 0: on the front too
    assert _front(url, "mo") == (["minimize", "maximize"],
                                 [(0, (1.0, 1.0)), (1, (2.0, 3.0)), (7, (1.0, 1.0))])


def test_the_best_of_one_objective_is_a_complete_trial(tmp_path: Path) -> None:
    """A PRUNED trial's last report (0.01, stored as its value by Optuna) is no result."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    study = optuna.create_study(storage=url, study_name="one", direction="maximize")
    study.tell(study.ask(), 0.5)
    pruned = study.ask()
    pruned.report(9.0, 1)
    study.tell(pruned, state=TrialState.PRUNED)
    assert study.trials[1].values == [9.0]  # Optuna keeps its last report as its value
    study.tell(study.ask(), 0.75)
    study.tell(study.ask(), 0.75)  # the earliest of equals
    assert _front(url, "one") == (["maximize"], [(2, (0.75,))])
