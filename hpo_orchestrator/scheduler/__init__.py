"""Scheduling: the shared trial budget, a run's first workers, and the orchestrator that runs
trials on the slots placement/ lays out: its loop, the children's calls, the workers' lifecycle.

This face imports no Optuna: a run lays out its slots and starts its first workers
(scheduler/_first_wave.py) before it imports Optuna and the orchestrator, so the workers'
start-up runs beside those imports. The orchestrator's loop, which imports Optuna, is the
public module ``hpo_orchestrator.scheduler.orchestrator``: the run (runner.py) imports it by
name once the first wave is under way.
"""

from __future__ import annotations

from hpo_orchestrator.scheduler._budget import Budget, count_claimed
from hpo_orchestrator.scheduler._first_wave import FirstWave
from hpo_orchestrator.scheduler._logs import read_tail, run_dir
from hpo_orchestrator.scheduler._trial import FinishedTrial, QuietReporter, Reporter, RunningTrial

__all__ = ["Budget", "FinishedTrial", "FirstWave", "QuietReporter", "Reporter", "RunningTrial",
           "count_claimed", "read_tail", "run_dir"]
