"""``best`` and ``enqueue``: the study's best params out, known params in."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from hpo_orchestrator.cli import _artifacts, _trials
from hpo_orchestrator.cli._common import errors

__all__ = ["cmd_best", "cmd_enqueue"]


def cmd_best(args: argparse.Namespace, console: Console) -> int:
    """``best``: the best trial, or a multi-objective study's Pareto front (or one of its
    trials: ``--index``/``--trial``), with its params as overrides and as an enqueue command."""
    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.study import enqueue_command, find_best, override_line

    engine = create_engine(args.storage)
    best = find_best(engine, _trials.resolve_study(engine, args.study, errors()))
    best = best.select(args.index, args.trial)
    if args.json:
        print(json.dumps(best.to_json(), indent=2))
        return 0
    directions = ", ".join(best.directions)
    if not best.trials:
        console.print(f"study {best.study!r} ({directions}): no COMPLETE trial yet", highlight=False)
        return 0
    several = len(best.directions) > 1
    console.print(f"study {best.study!r} ({directions}): " + (
        f"Pareto front, {best.front_size or len(best.trials)} trial(s)"
        + (f"; selected: trial #{best.trials[0].number}" if best.front_size else "") if several else
        f"best trial #{best.trials[0].number}, value {best.trials[0].values[0]!r}"), highlight=False)
    for trial in best.trials:
        if several:
            values = ", ".join(repr(v) for v in trial.values)
            console.print(f"\ntrial #{trial.number}: values {values}", highlight=False)
        width = max((len(n) for n in trial.params), default=0)
        for name, value in trial.params.items():
            console.print(f"  {name:<{width}}  {value!r}", highlight=False, markup=False)
        line = override_line(trial.params, best.objective)
        if line:
            console.print(f"overrides: {line}", highlight=False, markup=False, soft_wrap=True)
        console.print(f"enqueue:   {enqueue_command(best.study, trial.params)}", highlight=False,
                      markup=False, soft_wrap=True)
    _artifacts.mention_best(engine, best.study, console)
    return 0


def cmd_enqueue(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.study import enqueue_params, load_params

    done = enqueue_params(args.storage, args.study, load_params(args.params, args.file))
    added = ", ".join(f"#{n}" for n in done.added) or "none"
    console.print(f"study {done.study!r}: enqueued {len(done.added)} trial(s) ({added}) as WAITING"
                  + (f"; {done.skipped} already in the study, skipped" if done.skipped else ""),
                  highlight=False)
    if done.added and done.n_trials is not None and done.claimed >= done.n_trials:
        console.print(f"the study's budget is spent ({done.claimed} of study.n_trials="
                      f"{done.n_trials} trials ended): run it with a higher study.n_trials to "
                      f"try them", highlight=False)
    elif done.added:
        console.print("the next run of the study tries them first (they count against "
                      "study.n_trials once they run)", highlight=False)
    return 0

