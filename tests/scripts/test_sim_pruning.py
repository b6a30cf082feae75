"""scripts/sim_pruning.py: the event arithmetic of the replay, on hand-built trials whose
times are worked out by hand in each docstring."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import optuna
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sim_pruning.py"


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_pruning", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sim_pruning"] = module  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def _pool(sim: ModuleType) -> list:
    """A: 1 s before its steps, then 2 s a step; B: the same, but behind; C: no start-up, 1 s
    a step. Values minimized; B's first is over the threshold 0.85."""
    return [sim.SimTrial(0, 0.3, ((1, 0.5), (2, 0.4), (3, 0.3)), 1.0, 2.0),
            sim.SimTrial(1, 0.7, ((1, 0.9), (2, 0.8), (3, 0.7)), 1.0, 2.0),
            sim.SimTrial(2, 0.2, ((1, 0.6), (2, 0.5), (3, 0.2)), 0.0, 1.0)]


def _threshold() -> optuna.pruners.BasePruner:
    return optuna.pruners.ThresholdPruner(upper=0.85)


def test_two_workers_by_hand(sim: ModuleType) -> None:
    """A and B start at 0 on the two workers. B reports step 1 at 0 + 1 + 2 x 1 = 3 s, over
    the threshold: pruned, its worker takes C at 3 s, which reports at 4, 5, 6 s and completes
    at 6 s. A reports at 3, 5 and 7 s: complete at 7 s. The pool is then empty."""
    run = sim.simulate(_pool(sim), [0, 1, 2], _threshold, workers=2, budget_s=100.0)
    assert run.completions == [(6.0, 0.2), (7.0, 0.3)]
    assert run.complete_numbers == [2, 0]
    assert run.pruned == [(3.0, 1, 1)]
    assert (run.started, run.exhausted) == (3, True)


def test_time_to_target_and_budget_by_hand(sim: ModuleType) -> None:
    """Budget 6.5 s: C's completion at 6 s counts, A's at 7 s does not; a target of 0.25 is
    met at 6 s, one of 0.1 never (censored at the budget)."""
    run = sim.simulate(_pool(sim), [0, 1, 2], _threshold, workers=2, budget_s=6.5)
    assert run.completions == [(6.0, 0.2)]
    times = sim.times_to([run], 0.25, 6.5, "minimize") + sim.times_to([run], 0.1, 6.5, "minimize")
    assert [(t.seconds, t.censored) for t in times] == [(6.0, False), (6.5, True)]


def test_one_worker_and_a_gap_by_hand(sim: ModuleType) -> None:
    """One worker, 0.5 s between trials: A ends at 7 s; B starts at 7.5 s, pruned at
    7.5 + 3 = 10.5 s; C starts at 11 s and completes at 11 + 3 = 14 s."""
    run = sim.simulate(_pool(sim), [0, 1, 2], _threshold, workers=1, budget_s=100.0, gap_s=0.5)
    assert run.completions == [(7.0, 0.3), (14.0, 0.2)]
    assert run.pruned == [(10.5, 1, 1)]


def test_the_last_step_is_never_judged(sim: ModuleType) -> None:
    """The objectives ask should_prune after every report but the last: a trial over the
    threshold only at its last step completes, at 0 + 1 x 2 = 2 s."""
    late = [sim.SimTrial(0, 0.5, ((1, 0.5), (2, 0.95)), 0.0, 1.0)]
    run = sim.simulate(late, [0], _threshold, workers=1, budget_s=10.0)
    assert (run.completions, run.pruned) == ([(2.0, 0.5)], [])


def test_the_pruner_sees_the_trials_running_beside(sim: ModuleType) -> None:
    """Two trials at once: the pruner's study holds both while they run, as the orchestrator's
    study does; at B's first report (3 s) A is RUNNING with its own first value reported."""
    seen: list[list[str]] = []

    class Spy(optuna.pruners.BasePruner):
        def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
            seen.append([t.state.name for t in study.get_trials(deepcopy=False)])
            return False

    sim.simulate(_pool(sim)[:2], [0, 1], Spy, workers=2, budget_s=100.0)
    assert seen[:2] == [["RUNNING", "RUNNING"], ["RUNNING", "RUNNING"]]


def test_a_level_scales_each_study_by_its_medians(sim: ModuleType) -> None:
    """At 2 per GPU, a trial recorded at 1 per GPU takes the 2-per-GPU study's medians over
    its own: overheads 3.0 / 2.0 = 1.5x, steps 1.5 / 1.0 = 1.5x here; the level's own trials
    stay as recorded; numbers run through both studies."""
    one = sim.Recorded("c-tpg1", 1, "minimize", [sim.SimTrial(0, 0.5, ((1, 0.5),), 2.0, 1.0)])
    two = sim.Recorded("c-tpg2", 2, "minimize", [sim.SimTrial(0, 0.4, ((1, 0.4),), 3.0, 1.5)])
    pool = sim.pool_at([one, two], level=2)
    assert [(t.number, t.overhead_s, t.step_s) for t in pool] == [(0, 3.0, 1.5), (1, 3.0, 1.5)]
    assert [(t.overhead_s, t.step_s) for t in sim.pool_at([one, two], level=None)] == [(2.0, 1.0), (3.0, 1.5)]


def test_each_worker_pays_its_start_up_once(sim: ModuleType) -> None:
    """2 s of worker start-up: A and B start at 2 s; B is pruned at its first report,
    2 + 1 + 2 = 5 s, and its worker takes C at once (a reuse worker starts nothing again): C
    reports at 6, 7, 8 s. A completes at 2 + 1 + 2 x 3 = 9 s."""
    run = sim.simulate(_pool(sim), [0, 1, 2], _threshold, workers=2, budget_s=100.0, worker_s=2.0)
    assert run.completions == [(8.0, 0.2), (9.0, 0.3)]
    assert run.pruned == [(5.0, 1, 1)]


def test_a_worker_start_up_is_the_recorded_workers_median(sim: ModuleType) -> None:
    one = sim.Recorded("c-tpg1", 1, "minimize", [], "tpe", [16.0])
    three = sim.Recorded("c-tpg3", 3, "minimize", [], "tpe", [17.0, 18.0, 20.0])
    assert sim.worker_startup([one, three], 3) == 18.0
    assert sim.worker_startup([one, three], None) == 17.5
    assert sim.worker_startup([sim.Recorded("fresh", None, "minimize", [])], None) == 0.0


def test_the_curves_are_replayed_as_the_objectives_report_them(sim: ModuleType) -> None:
    raw = ((1, 0.5), (2, 0.4), (3, 0.45), (4, 0.3))
    assert sim.best_so_far(raw, "minimize") == ((1, 0.5), (2, 0.4), (3, 0.4), (4, 0.3))
    assert sim.best_so_far(raw, "maximize") == ((1, 0.5), (2, 0.5), (3, 0.5), (4, 0.5))


def _places(sim: ModuleType, count: int) -> list:
    return [sim.SimTrial(n, float(n), ((1, float(n)),), 0.0, 1.0, n) for n in range(count)]


def test_the_sampler_proposes_from_its_progress(sim: ModuleType) -> None:
    """Window 0: after j trials in its view the sampler proposes the one recorded at place j,
    held at the last place; a place already drawn widens the window to its neighbours."""
    progress = sim.Progress(_places(sim, 6), seed=0, window=0)
    assert [progress.draw(j) for j in (0, 1, 2)] == [0, 1, 2]
    assert progress.draw(9) == 5  # past the record: its last place
    assert progress.draw(2) == 3  # 2 is taken: a neighbour not taken (1 is)
    assert progress.draw(2) == 4  # 1 to 3 taken: the window widens to 2 (0 is taken too)
    assert progress.draw(0) in range(6)  # every place taken: any of the window again


def test_under_hyperband_the_sampler_sees_the_trials_bracket(sim: ModuleType) -> None:
    """Optuna splits TPE's history by bracket under a HyperbandPruner and not under our
    delayed verdict over it: the sampler's progress is counted in the view Optuna gives."""
    import optuna

    def view(pruner: optuna.pruners.BasePruner) -> tuple[list[int], list[int]]:
        study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="sim",
                                    pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
        first = study.ask()
        first.report(1.0, 1)
        study.tell(first, 1.0)  # complete at step 1: Hyperband sets its brackets up on a prune
        seen, expected = [], []
        for _ in range(12):
            trial = study.ask()
            seen.append(sim.sampler_view(study, trial))
            bracket = optuna.pruners._filter_study(study, study._storage.get_trial(trial._trial_id))
            expected.append(len(bracket.get_trials(deepcopy=False)) - 1)
            trial.report(0.5, 1)
            trial.should_prune()
        return seen, expected

    hyperband = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=27, reduction_factor=3)
    seen, expected = view(hyperband)
    assert seen == expected and seen != list(range(1, 13))  # its bracket only
    from hpo_orchestrator.config import PatientHyperbandPrunerConfig

    delayed = PatientHyperbandPrunerConfig(patience_mode="delay", min_resource=1, max_resource=27).build()
    assert view(delayed)[0] == list(range(1, 13))  # every trial before it


def test_a_run_draws_by_the_samplers_progress(sim: ModuleType) -> None:
    """order="progress": the k-th trial, proposed after k others, comes from the places
    within the window (2 here) of k; a random order of the pool does not keep to that."""
    pool = _places(sim, 40)
    runs = sim.run_all(pool, ["none"], seeds=3, workers=1, budget_s=40.0, direction="minimize",
                       order="progress")
    for run in runs["none"]:
        assert len(run.complete_numbers) == 40 and not run.exhausted
        assert all(n <= k + 2 for k, n in enumerate(run.complete_numbers[:30]))
