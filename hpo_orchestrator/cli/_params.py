"""``best`` and ``enqueue``: a study's best params out as overrides, known params in.

``best`` reads with plain SQL (db/_best.py), like ``status``; ``enqueue`` goes through Optuna's
own ``Study.enqueue_trial``, so the trials are WAITING ones that the next ``ask`` of any
orchestrator takes first. They count against ``study.n_trials`` once they run, as every
trial does (a WAITING trial does not count: scheduler/_budget.py).

The package's imports are deferred into the functions, as in every command module: the CLI
imports this module for every command.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from hpo_orchestrator.cli import _artifacts, _first_hour
from hpo_orchestrator.cli._common import errors
from hpo_orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["BestTrial", "BestTrials", "Enqueued", "cmd_best", "cmd_enqueue", "enqueue_command",
           "enqueue_params", "find_best", "load_params", "override_line", "overrides"]


def cmd_best(args: argparse.Namespace, console: Console) -> int:
    """``best``: the best trial, or a multi-objective study's Pareto front (or one of its
    trials: ``--index``/``--trial``), with its params as overrides and as an enqueue command."""
    from hpo_orchestrator.db.connect import create_engine

    engine = create_engine(args.storage)
    best = find_best(engine, _first_hour.resolve_study(engine, args.study, errors()))
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


@dataclass(frozen=True)
class BestTrial:
    number: int
    values: tuple[float, ...]
    params: dict[str, Any]


@dataclass(frozen=True)
class BestTrials:
    """The best trial (one objective) or the Pareto front (several), with what the study ran."""

    study: str
    directions: list[str]
    objective: str | None  # the objective's name in hpo.config (None: not run by us)
    trials: list[BestTrial]
    front_size: int | None = None  # set once select() kept one trial of the front

    def select(self, index: int | None, number: int | None) -> BestTrials:
        """The front's ``index``-th trial, or its trial ``number``: one of several objectives'
        best trials to paste (ConfigError, exit 2, naming the front's trials otherwise)."""
        if index is None and number is None:
            return self
        numbers = ", ".join(str(t.number) for t in self.trials) or "none yet"
        flag = f"--index {index}" if index is not None else f"--trial {number}"
        if index is not None and 0 <= index < len(self.trials):
            return replace(self, trials=[self.trials[index]], front_size=len(self.trials))
        chosen = [t for t in self.trials if t.number == number]
        if chosen:
            return replace(self, trials=chosen, front_size=len(self.trials))
        raise ConfigError(f"{flag}: study {self.study!r} has {len(self.trials)} best trial(s) "
                          f"(Pareto front: {numbers})",
                          f"--index takes 0 to {max(len(self.trials) - 1, 0)}; --trial one of "
                          f"the numbers above")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"study": self.study, "directions": self.directions,
                                "objective": self.objective,
                                "best_trials": [{"number": t.number, "values": list(t.values),
                                                 "params": t.params,
                                                 "overrides": overrides(t.params, self.objective)}
                                                for t in self.trials]}
        if len(self.directions) == 1 and self.trials:
            best = self.trials[0]
            data.update({"number": best.number, "value": best.values[0], "params": best.params,
                         "overrides": overrides(best.params, self.objective)})
        return data


def find_best(engine: Engine, study: str | None) -> BestTrials:
    from hpo_orchestrator.db import best_trials, read_errors, study_config, study_id_of, trial_params

    with read_errors(), engine.connect() as connection:
        study_id, name = study_id_of(connection, study)
        directions, front = best_trials(connection, study_id)
        objective = (study_config(connection, study_id).get("objective") or {}).get("name")
        trials = [BestTrial(t.number, t.values, trial_params(connection, t.trial_id)) for t in front]
    return BestTrials(name, directions, objective, trials)


def overrides(params: dict[str, Any], objective: str | None) -> list[str]:
    """``KEY=VALUE`` overrides that fix every param of a built-in objective (full precision);
    empty for a custom objective, whose space lives in its code."""
    from hpo_orchestrator.config import SPACES

    space = SPACES.get(objective or "")
    if space is None:
        return []
    found = []
    for name, value in params.items():
        if name in space:
            found.append(f"objective.search_space.{name}.value={value!r}")
        elif objective == "torch_mlp" and name == "batch_size":
            found.append(f"objective.batch_size={value!r}")
    return found


def override_line(params: dict[str, Any], objective: str | None) -> str:
    return " ".join(overrides(params, objective))


def enqueue_command(study: str, params: dict[str, Any]) -> str:
    return f"hpo-orchestrator enqueue --study {shlex.quote(study)} --params " \
           f"{shlex.quote(json.dumps(params))}"


# --- enqueue ------------------------------------------------------------------------------


def load_params(params: str | None, file: Path | None) -> list[dict[str, Any]]:
    """``--params JSON`` (one object) or ``--file`` (JSON or YAML: one mapping or a list)."""
    import yaml

    from hpo_orchestrator.config import check_params

    if (params is None) == (file is None):
        raise ConfigError("give --params JSON or --file FILE (one of them)",
                          "e.g. --params '{\"learning_rate\": 0.05, \"num_leaves\": 31}'")
    if params is not None:
        try:
            loaded: Any = json.loads(params)
        except ValueError as exc:
            raise ConfigError(f"--params: not JSON ({exc})",
                              "quote it for the shell: --params '{\"x\": 1}'") from None
        where = "--params"
    else:
        assert file is not None
        try:
            loaded = yaml.safe_load(file.read_text())
        except OSError as exc:
            raise ConfigError(f"--file: cannot read {str(file)!r} ({exc.strerror})",
                              "give a JSON or YAML file") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--file: {file} is neither JSON nor YAML ({exc})",
                              "a mapping of params, or a list of them") from None
        where = f"--file {file}"
    entries = loaded if isinstance(loaded, list) else [loaded]
    check_params(entries, None, None, where)
    return entries


@dataclass(frozen=True)
class Enqueued:
    study: str
    added: list[int]  # numbers of the new WAITING trials
    skipped: int  # entries already in the study
    claimed: int  # trials that count against n_trials so far
    n_trials: int | None  # the study's n_trials (hpo.config), when known


def enqueue_params(url: str, study: str | None, entries: list[dict[str, Any]]) -> Enqueued:
    """Enqueue ``entries`` into an existing study (Optuna's enqueue_trial; an entry that
    equals a trial already in the study is skipped)."""
    import warnings

    import optuna

    from hpo_orchestrator.config import check_params
    from hpo_orchestrator.db import read_errors, study_config, study_id_of, study_space
    from hpo_orchestrator.db.connect import create_engine, open_rdb_storage
    from hpo_orchestrator.scheduler import count_claimed
    from hpo_orchestrator.study import trials_space

    engine = create_engine(url)
    with read_errors(), engine.connect() as connection:
        study_id, name = study_id_of(connection, study)
        config = study_config(connection, study_id)
        tried = trials_space(study_space(connection, study_id))
    objective = config.get("objective") or {}
    check_params(entries, objective.get("name"), objective.get("search_space"), "--params", tried)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "Skipping enqueue" per entry
    loaded = optuna.load_study(study_name=name, storage=open_rdb_storage(url))
    before = {t.number for t in loaded.get_trials(deepcopy=False)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        for entry in entries:
            loaded.enqueue_trial(entry, skip_if_exists=True)
    added = sorted({t.number for t in loaded.get_trials(deepcopy=False)} - before)
    with engine.connect() as connection:
        claimed = count_claimed(connection, study_id)
    n_trials = (config.get("study") or {}).get("n_trials")
    return Enqueued(name, added, len(entries) - len(added), claimed,
                    n_trials if isinstance(n_trials, int) else None)
