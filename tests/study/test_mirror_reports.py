"""A running trial's reports in the run's mirror (study_storage.py): kept back and written in
batches at most ``refresh_s`` late, but always seen by the pruner and the sampler at once,
also across a refresh: a refresh rereads our running trials from the database, so it writes
the reports kept back first (else the reread copy would lack them until the next refresh)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpo_orchestrator.db.connect import open_rdb_storage
from hpo_orchestrator.study import MirrorStorage
from tests.study.test_scale import _Clock

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_refresh_keeps_the_reports_kept_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    clock = _Clock()
    storage = MirrorStorage(open_rdb_storage(url), refresh_s=1.0, clock=clock)
    study = optuna.create_study(study_name="s", storage=storage, pruner=optuna.pruners.MedianPruner(
        n_startup_trials=0, n_warmup_steps=0))
    done = study.ask()  # a good trial to compare against: its reports written at its end
    for step in (1, 2, 3):
        done.report(1.0, step)
    study.tell(done, 1.0)
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    plain = optuna.load_study(study_name="s", storage=url)
    expected: dict[int, float] = {}
    for batch, steps in enumerate(([1, 2], [3])):
        for step in steps:
            trial.report(5.0 + step, step)  # kept back: refresh_s has not passed
            expected[step] = 5.0 + step
        assert plain.trials[1].intermediate_values != expected  # not written yet
        clock.now += 1.0
        assert [t.state for t in study.get_trials(deepcopy=False)] == [
            TrialState.COMPLETE, TrialState.RUNNING]  # this read refreshes the mirror
        assert storage.get_trial(trial._trial_id).intermediate_values == expected, batch
        assert trial.should_prune(), batch  # the pruner sees them: worse than the median
        assert plain.trials[1].intermediate_values == expected, batch  # and they are written
    study.tell(trial, 9.0)
    assert plain.trials[1].intermediate_values == expected


def test_the_first_read_of_the_history_keeps_the_reports_kept_back(tmp_path: Path) -> None:
    """The mirror starts with the unfinished trials only and reads the history at the first
    read that needs it: with a sampler that reads none (random), that can be a pruner's
    (``pruner.patience_mode=reach`` reads the complete trials at each report) while a trial
    has reports kept back. The reread copy must keep them: it is the curve every later
    decision reads of that trial, once complete."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    storage = MirrorStorage(open_rdb_storage(url), refresh_s=1.0, clock=_Clock())
    study = optuna.create_study(study_name="s", storage=storage,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    for step in (1, 2):
        trial.report(float(step), step)  # kept back: refresh_s has not passed
    assert study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) == []
    assert storage.get_trial(trial._trial_id).intermediate_values == {1: 1.0, 2: 2.0}
    trial.report(3.0, 3)
    study.tell(trial, 3.0)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert [t.intermediate_values for t in done] == [{1: 1.0, 2: 2.0, 3: 3.0}]
