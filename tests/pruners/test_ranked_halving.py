"""pruner=ranked_halving (pruners/_ranked.py): what its module doc promises, on studies built
by hand: nothing pruned before ``min_complete`` complete trials; the cheapest ladder that
keeps the best trials (the earliest where ranks hold, after the crossing where they do not,
none where the best trail to the end); trials a rung judged are no evidence, audit trials
run to the end; a rung judged against every trial that reached its step; both directions;
and on curves that keep improving it prunes where the default patient pruner does not."""

from __future__ import annotations

import math
import sqlite3
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo_orchestrator.config import PatientHyperbandPrunerConfig, RankedHalvingPrunerConfig, load_config
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.pruners._ranked import JUDGED, Ladder, RankedHalvingPruner
from hpo_orchestrator.pruning._factory import build_pruner
from tests.conftest import run_cli

STEPS = 10

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)


def _study(pruner: optuna.pruners.BasePruner, direction: str = "minimize") -> optuna.Study:
    return optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction=direction,
                               pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))


def _complete(study: optuna.Study, curve: list[float]) -> None:
    """A trial that reports every step and completes with its best value."""
    trial = study.ask()
    for step, value in enumerate(curve, 1):
        trial.report(value, step)
    best = (min if study.direction == optuna.study.StudyDirection.MINIMIZE else max)(curve)
    study.tell(trial, best)


def _pruned_at(study: optuna.Study, curve: list[float]) -> int | None:
    """Run ``curve`` as an objective does (no question at the last step): the step it was
    pruned at, or None when it completed."""
    trial = study.ask()
    for step, value in enumerate(curve, 1):
        trial.report(value, step)
        if step < len(curve) and trial.should_prune():
            study.tell(trial, state=TrialState.PRUNED)
            return step
    study.tell(trial, min(curve))
    return None


def _steady(level: float) -> list[float]:
    """Improving at every step, never crossing another level's curve."""
    return [level + 1.0 / step for step in range(1, STEPS + 1)]


def _ranked(**kwargs: int) -> RankedHalvingPruner:
    return RankedHalvingPruner(**{"reduction_factors": (3,), "protect": 3, "min_complete": 10, **kwargs})


def test_nothing_is_pruned_before_min_complete_trials() -> None:
    """Four steady trials complete, then a trial far behind at every step: not pruned with
    min_complete=5. After a fifth completes, the same trial is pruned at the first rung."""
    study = _study(_ranked(min_complete=5, protect=1))
    for level in (0.1, 0.2, 0.3, 0.4):
        _complete(study, _steady(level))
    assert _pruned_at(study, _steady(5.0)) is None
    _complete(study, _steady(0.5))
    assert _pruned_at(study, _steady(5.0)) == 1


def test_stable_ranks_give_the_earliest_ladder() -> None:
    """Twelve curves that never cross: every ladder keeps the three best, so the cheapest
    wins: rungs at 1, 3 and 9 (of 10 steps). A trial in the bottom two thirds at step 1 is
    pruned there; one in the top third goes on to the end."""
    pruner = _ranked()
    study = _study(pruner)
    for i in range(12):
        _complete(study, _steady(0.1 * i))
    assert _pruned_at(study, _steady(0.55)) == 1
    assert pruner.ladder == Ladder.of(1, 3, STEPS) and pruner.ladder.rungs == (1, 3, 9)
    assert _pruned_at(study, _steady(0.05)) is None


def _slow_best(j: int) -> list[float]:
    """Behind every fast trial up to step 4 (0.68 at step 4), ahead from step 5 (0.60), the
    study's best at the end (0.40 + 0.01 j)."""
    return [max(0.4 + 0.01 * j, 1.0 - 0.08 * step) for step in range(1, STEPS + 1)]


def test_crossing_curves_put_the_first_rung_after_the_crossing() -> None:
    """Nine flat trials at 0.61-0.69 and three slow starters that end best: a rung before
    step 5 would have cut the three best, so the cheapest ladder that keeps them starts at 5
    (5 + 5/3 expected steps; none starting later is cheaper). A new slow starter is judged at
    step 5 only and completes; a trial last at step 5 is pruned there."""
    pruner = _ranked()
    study = _study(pruner)
    for i in range(9):
        _complete(study, [0.61 + 0.01 * i] * STEPS)
    for j in range(3):
        _complete(study, _slow_best(j))
    assert _pruned_at(study, _slow_best(3)) is None
    assert pruner.ladder is not None and (pruner.ladder.first, pruner.ladder.rungs) == (5, (5,))
    assert _pruned_at(study, [0.99] * STEPS) == 5


def test_no_ladder_while_the_best_trail_until_the_end() -> None:
    """The three best complete trials are last at every step but the final one: no rung below
    the end keeps them, so nothing is pruned, as with no pruner."""
    pruner = _ranked()
    study = _study(pruner)
    for i in range(9):
        _complete(study, [0.5 + 0.01 * i] * STEPS)
    for j in range(3):
        _complete(study, [0.9] * (STEPS - 1) + [0.3 + 0.01 * j])
    assert _pruned_at(study, [0.99] * STEPS) is None
    assert pruner.ladder is None


def test_a_judged_trial_is_no_evidence() -> None:
    """The crossing study of the test above puts the first rung at step 5. Then three trials
    that lead at every step and end best: they survive the rung at 5, so they were judged
    (selected by the cut) and are no evidence; the ladder stays at 5. Counted as evidence
    they would be the three best, ranked first from step 1, and move the ladder to step 1:
    the creep of a ladder chosen from its own survivors."""
    pruner = _ranked(audit_every=0)
    study = _study(pruner)
    for i in range(9):
        _complete(study, [0.61 + 0.01 * i] * STEPS)
    for j in range(3):
        _complete(study, _slow_best(j))
    for j in range(3):
        assert _pruned_at(study, [0.30 + 0.01 * j] * STEPS) is None
        assert study.trials[-1].system_attrs[JUDGED] is True
    assert _pruned_at(study, [0.99] * STEPS) == 5
    assert pruner.ladder is not None and pruner.ladder.first == 5


def test_every_audit_trial_runs_to_the_end() -> None:
    """With audit_every=2, trial 12 (an even number) is behind at every rung and still runs to
    the end, unjudged: evidence for the next choice. Trial 13, as far behind, is pruned at
    the first rung."""
    pruner = _ranked(audit_every=2)
    study = _study(pruner)
    for i in range(12):
        _complete(study, _steady(0.1 * i))
    assert _pruned_at(study, _steady(5.0)) is None
    assert JUDGED not in study.trials[-1].system_attrs
    assert _pruned_at(study, _steady(5.0)) == 1


def test_a_rung_counts_every_trial_that_reached_its_step() -> None:
    """Rivals at a rung are all trials with a value at its step, running ones included (as
    Optuna's SuccessiveHalvingPruner counts every trial that reached the rung): 12 complete
    trials at 0.5-0.61 at step 1 and 8 running ones at 0.10-0.17 put a trial at 0.45 9th of
    21, outside the best 21 // 3 = 7: pruned. Among the complete ones alone it would lead."""
    study = _study(_ranked(audit_every=0))
    for i in range(12):
        _complete(study, _steady(0.01 * i - 0.5))
    for i in range(8):
        running = study.ask()
        running.report(0.10 + 0.01 * i, 1)
    trial = study.ask()
    trial.report(0.45, 1)
    assert trial.should_prune()


def test_a_maximized_study_keeps_its_highest() -> None:
    """The same steady curves, negated, in a study that maximizes: the lowest at step 1 is
    pruned there, the highest completes."""
    study = _study(_ranked(), direction="maximize")
    for i in range(12):
        _complete(study, [-v for v in _steady(0.1 * i)])
    assert _pruned_at(study, [-v for v in _steady(0.55)]) == 1
    trial = study.ask()
    for step, value in enumerate(_steady(0.05), 1):
        trial.report(-value, step)
        assert step == STEPS or not trial.should_prune()


def test_nan_never_goes_on() -> None:
    study = _study(_ranked())
    for i in range(12):
        _complete(study, _steady(0.1 * i))
    trial = study.ask()
    trial.report(math.nan, 1)
    assert trial.should_prune()


def test_a_ladders_expected_steps_by_hand() -> None:
    """Rungs at 1, 3, 9 of 10 steps, a third going on at each: 1 + 2/3 + 6/9 + 1/27 steps per
    trial; a single rung at 5: 5 + 5/3."""
    assert Ladder.of(1, 3, 10).expected_steps == pytest.approx(1 + 2 / 3 + 6 / 9 + 1 / 27)
    assert (Ladder.of(5, 3, 10).rungs, Ladder.of(5, 3, 10).expected_steps) == ((5,), pytest.approx(5 + 5 / 3))


def test_curves_that_keep_improving_are_pruned_where_patience_waits() -> None:
    """The case that motivates the pruner (docs/QUALITY.md, workload c): every curve improves
    at every step, so PatientPruner(Hyperband) with patience 3 never prunes; ranked halving
    prunes most of the trials behind at its rungs once ten have completed."""
    levels = [((7 * i) % 30) / 30 for i in range(40)]  # a fixed shuffle of 30 levels
    counts = {}
    for name, pruner in (("patient", build_pruner(PatientHyperbandPrunerConfig(patience_mode="veto"))),
                         ("ranked", build_pruner(RankedHalvingPrunerConfig()))):
        study = _study(pruner)
        counts[name] = sum(_pruned_at(study, _steady(level)) is not None for level in levels)
    assert counts["patient"] == 0
    assert counts["ranked"] >= 15


def test_config_defaults_and_bad_values() -> None:
    pruner = load_config(["pruner=ranked_halving"]).pruner
    assert (pruner.name, list(pruner.reduction_factors), pruner.protect, pruner.min_complete,
            pruner.audit_every) == ("ranked_halving", [3], 3, 10, 5)
    assert isinstance(build_pruner(pruner), RankedHalvingPruner)
    for overrides, key in ((["pruner.reduction_factors=[1]"], "pruner.reduction_factors"),
                           (["pruner.reduction_factors=[]"], "pruner.reduction_factors"),
                           (["pruner.protect=0"], "pruner.protect"),
                           (["pruner.min_complete=2"], "pruner.min_complete"),
                           (["pruner.audit_every=1"], "pruner.audit_every"),
                           (["pruner.audit_every=-1"], "pruner.audit_every")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(["pruner=ranked_halving", *overrides])


@pytest.mark.long
@pytest.mark.slow
def test_a_run_prunes_steady_curves_and_marks_the_judged(tmp_path: Path) -> None:
    """End to end through the orchestrator (decisions answered in its process, the mark
    written through its storage): 30 trials of curves that improve at every step and never
    cross. PatientPruner (patience_mode=veto) stops none; ranked_halving stops some once 10
    have completed, and every trial it stopped carries the judged mark."""
    counts = {}
    for pruner, options in (("patient_hyperband", ["pruner.patience_mode=veto"]), ("ranked_halving", [])):
        (tmp_path / pruner).mkdir()
        result = run_cli(tmp_path / pruner, "run", "objective=custom",
                         "objective.target=tests.objectives:curves",
                         "scheduler.parallel=2", "study.n_trials=30", f"pruner={pruner}", *options,
                         "scheduler.gpus=none")
        assert result.code == 0, result.stderr
        with sqlite3.connect(result.db) as con:
            counts[pruner] = con.execute(
                "SELECT COUNT(*), SUM(EXISTS (SELECT 1 FROM trial_system_attributes a WHERE "
                "a.trial_id = t.trial_id AND a.key = ?)) FROM trials t WHERE state = 'PRUNED'",
                (JUDGED,)).fetchone()
    assert counts["patient_hyperband"][0] == 0
    assert counts["ranked_halving"][0] >= 3 and counts["ranked_halving"][1] == counts["ranked_halving"][0]
