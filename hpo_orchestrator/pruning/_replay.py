"""``tune-pruner``: replay a study's stored learning curves through Optuna's own pruners.

For each pruner setting of a grid, a fresh in-memory study with the same name and direction
is fed the stored trials in trial-number order: each trial reports its stored intermediate
values one step at a time and asks ``should_prune`` after each, exactly as the objective did.
Same study name and numbers matter: Hyperband puts a trial in a bracket by a hash of both.

What a replay cannot know (the documented limits):
- How a trial that was pruned in the real study would have gone on. When a setting lets such
  a trial pass its last stored step, its outcome is ``unknown``: it counts as running to the
  full length for the cost (pessimistic) and never as a best value.
- Concurrency. The real study ran trials side by side, so a pruner saw fewer finished trials
  at each decision than the sequential replay does. ``agreement`` says how often the replay
  of the setting the study ran with reproduces what really happened.
- The sampler. The replayed trials are the ones the study's sampler proposed; a setting that
  would have changed what it proposed (under a ``HyperbandPruner`` Optuna splits TPE's history
  by bracket, so each bracket's TPE starts over with random trials) is judged on proposals it
  would not have had. scripts/sim_pruning.py models that; the replay does not.

Costs: a reuse worker's first trial carried the worker's start-up (imports, data, CUDA) inside
it; ``load_curves`` keeps that apart (``TrialCurve.worker_s``: above the study's usual
per-trial start-up, the median of the other trials'), paid whatever a pruner decides.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy.engine import Engine

from hpo_orchestrator import db
from hpo_orchestrator.config import PRUNERS, PrunerConfig, Replay, Varied, as_it_ran, grid_of
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.pruning._auto import StepTiming, stored_timings
from hpo_orchestrator.pruning._factory import build_pruner

KEEP_CURRENT_WITHIN = 0.05  # of the study's device time: smaller savings don't justify a change

__all__ = ["PrunerSetting", "ReplayResult", "StudyCurves", "TrialCurve", "default_grid", "load_curves",
           "recommend", "replay", "tune"]


@dataclass(frozen=True)
class TrialCurve:
    """One stored trial: its learning curve and what a step of it cost."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, ...
    value: float | None
    steps: tuple[tuple[int, float], ...]  # (step, intermediate value), by step
    overhead_s: float  # start-up and anything before the steps (the intercept of time vs step)
    step_s: float  # seconds per step unit
    # A reuse worker's first trial: the worker's own start-up (imports, data, CUDA context) ran
    # inside it, above the study's usual per-trial start-up; paid once per worker, whatever a
    # pruner decides (load_curves splits it out of overhead_s)
    worker_s: float = 0.0

    def cost_s(self, step: int | None) -> float:
        """Device seconds to run this trial up to ``step`` (its start-up, and its worker's
        where it carried that, included)."""
        return self.worker_s + self.overhead_s + self.step_s * max(0, step or 0)


@dataclass
class StudyCurves:
    study: str
    direction: str
    config: dict[str, Any]
    curves: list[TrialCurve]
    # The number the replay starts at: 0, or the first of the newest trials that were read
    # (load_curves' ``last``); the trials before it are not replayed, not even as padding.
    first_number: int = 0

    @property
    def full_step(self) -> int:
        """The last step a completed trial reached: how long an unpruned trial runs."""
        return max((c.steps[-1][0] for c in self.curves if c.state == "COMPLETE" and c.steps),
                   default=max((c.steps[-1][0] for c in self.curves if c.steps), default=0))


def _replay_of(kind: str) -> Replay:
    """How pruner ``kind`` is replayed: declared by its config (config/_search.py)."""
    replay: Replay | None = getattr(PRUNERS.get(kind), "REPLAY", None)
    if replay is None:
        raise ValueError(f"pruner {kind!r} is not replayed")
    return replay


class PrunerSetting:
    """One point of the grid: a registered pruner (``kind``, its name in ``PRUNERS``) and a
    value for each option its ``REPLAY`` varies (unset: None, the option's ``default`` when
    built). ``setting.patience`` reads one of them."""

    __slots__ = ("_values", "kind")

    def __init__(self, kind: str, **values: int | None) -> None:
        varied = _replay_of(kind).varied
        unknown = set(values) - {o.name for o in varied}
        if unknown:
            raise ValueError(f"pruner {kind!r} does not vary {', '.join(sorted(unknown))}")
        self.kind = kind
        self._values = tuple((o.name, values.get(o.name)) for o in varied)

    def __getattr__(self, name: str) -> int | None:
        if name.startswith("_"):
            raise AttributeError(name)
        for key, value in self._values:
            if key == name:
                return value
        return None  # an option this kind does not vary

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrunerSetting) and (self.kind, self._values) == (other.kind, other._values)

    def __hash__(self) -> int:
        return hash((self.kind, self._values))

    def __repr__(self) -> str:
        return f"PrunerSetting({self.label()})"

    def __getstate__(self) -> tuple[str, tuple[tuple[str, int | None], ...]]:
        return self.kind, self._values

    def __setstate__(self, state: tuple[str, tuple[tuple[str, int | None], ...]]) -> None:
        self.kind, self._values = state

    def _pairs(self) -> list[tuple[Varied, int | None]]:
        values = dict(self._values)
        return [(o, values[o.name]) for o in _replay_of(self.kind).varied]

    def values(self) -> dict[str, int | None]:
        return dict(self._values)

    def label(self) -> str:
        """'median(warmup=3, startup_trials=5)'."""
        return f"{self.kind}({', '.join(f'{o.shown}={v}' for o, v in self._pairs())})"

    def short(self) -> str:
        """For a table column: 'PH p3 m1 r3' (PatientPruner over Hyperband), 'median w3',
        'H m1 r3' (Hyperband alone)."""
        return " ".join([_replay_of(self.kind).short,
                         *(f"{o.letter}{v}" for o, v in self._pairs() if o.letter)])

    def overrides(self) -> str:
        """The `hpo-orchestrator run` overrides that select this setting."""
        return " ".join([f"pruner={self.kind}", *(f"pruner.{o.name}={v}" for o, v in self._pairs())])

    def config(self, recorded: Mapping[str, Any] | None = None) -> PrunerConfig:
        """The run's pruner config for this setting: this point of the grid applied to the
        study's recorded pruner config (``hpo.config``'s ``pruner``), so that an option the
        grid does not vary (``min_delta``, ``max_resource``, ``interval_steps``, and any
        option added later) is the study's, not dropped; one of another kind of pruner gives
        nothing (its options are another pruner's)."""
        kind = PRUNERS[self.kind]
        options = {f.name for f in fields(kind)} - {"name"}
        ran = as_it_ran(recorded or {})
        kept = {k: v for k, v in ran.items() if k in options} if ran.get("name") == self.kind else {}
        if not isinstance(kept.get("max_resource"), int):
            kept.pop("max_resource", None)  # "auto" or an odd value: Hyperband's own "auto"
        config: PrunerConfig = kind(**{**kept, **{o.name: o.default if v is None else v
                                                  for o, v in self._pairs()}})
        return config

    def build(self, recorded: Mapping[str, Any] | None = None) -> Any:
        return build_pruner(self.config(recorded))


@dataclass
class ReplayResult:
    setting: PrunerSetting
    current: bool  # the setting the study ran with
    outcomes: dict[int, str]  # trial number -> complete / pruned / unknown
    prune_steps: dict[int, int]  # trial number -> step at which the replay pruned it
    trials: int
    prune_rate: float
    median_prune_step: float | None
    steps_run: int
    gpu_s: float
    gpu_s_saved: float  # against the study as it ran (negative: the setting costs more)
    startup_share: float | None  # start-up seconds over all device seconds
    top_k: list[int]  # the study's k best completed trials
    top_k_kept: list[int]  # ... those this setting would have let complete
    best_value: float | None  # best value among the trials this setting completes
    agreement: float | None = None  # share of trials where the replay matches the real study
    unknown: int = 0  # trials pruned in reality that this setting would have let go on

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting.label(), "kind": self.setting.kind,
                "overrides": self.setting.overrides(), "current": self.current,
                "trials": self.trials, "prune_rate": round(self.prune_rate, 4),
                "median_prune_step": self.median_prune_step, "steps_run": self.steps_run,
                "gpu_s": round(self.gpu_s, 2), "gpu_s_saved": round(self.gpu_s_saved, 2),
                "startup_share": None if self.startup_share is None else round(self.startup_share, 4),
                "top_k": self.top_k, "top_k_kept": self.top_k_kept, "best_value": self.best_value,
                "agreement": None if self.agreement is None else round(self.agreement, 4),
                "unknown": self.unknown, "prune_steps": {str(k): v for k, v in self.prune_steps.items()}}


# --- reading the study ---------------------------------------------------------------------


def load_curves(engine: Engine, study: str | None, last: int | None = None) -> StudyCurves:
    """The intermediate values and timing of every trial, or of the newest ``last`` trials,
    with plain SQL (no ORM load)."""
    with db.read_errors(), engine.connect() as connection:
        study_id, name = db.study_id_of(connection, study)
        directions = db.study_directions(connection, study_id) or ["minimize"]
        if len(directions) > 1:
            raise ConfigError(
                f"study {name!r} has {len(directions)} objectives ({', '.join(directions)}): "
                "Optuna cannot prune a multi-objective study, so there is no pruner to tune",
                "tune-pruner replays single-objective studies; this one's trials ran to their "
                "end (pruner off): 'hpo-orchestrator best' lists its Pareto front")
        direction = directions[0]
        config = db.study_config(connection, study_id)
        first = db.first_of_last(connection, study_id, last)
        trials = db.trials_with_values(connection, study_id, first)
        steps = db.intermediate_values(connection, study_id, first)
        measured = stored_timings(connection, study_id, first)
        times = {row.number: row for row in db.trial_rows(connection, study_id, first)}
        firsts = db.worker_firsts(connection, study_id, first)
    timed = {trial.trial_id: _timing(tuple(steps.get(trial.trial_id, ())), measured.get(trial.trial_id),
                                     times.get(trial.number)) for trial in trials}
    # a trial's own start-up: the median over the trials no worker started for (reuse mode)
    usual = [timed[t.trial_id][0] for t in trials if t.trial_id not in firsts and t.trial_id in measured]
    own = statistics.median(usual) if usual else None
    curves = []
    for trial in trials:
        overhead, per_step = timed[trial.trial_id]
        worker = max(0.0, overhead - own) if own is not None and trial.trial_id in firsts else 0.0
        curves.append(TrialCurve(trial.number, trial.state, trial.value, tuple(steps.get(trial.trial_id, ())),
                                 overhead - worker, per_step, worker))
    return StudyCurves(name, direction, config, curves, first)


def _timing(curve: tuple[tuple[int, float], ...], measured: StepTiming | None,
            row: db.TrialRow | None) -> tuple[float, float]:
    """(overhead_s, step_s): measured by the orchestrator (hpo.overhead_s, hpo.step_s) where it
    recorded them; else spread the trial's run time after start-up evenly over its steps."""
    if measured is not None:
        return measured.overhead_s, measured.step_s
    if row is None or row.start_s is None or row.end_s is None or not curve:
        return 0.0, 0.0
    startup = row.startup_s or 0.0
    last = max(curve[-1][0], 1)
    return startup, max(0.0, row.end_s - row.start_s - startup) / last


# --- replaying -----------------------------------------------------------------------------


def top_trials(curves: StudyCurves, k: int) -> list[int]:
    """The study's k best completed trials, best first."""
    sign = 1.0 if curves.direction == "minimize" else -1.0
    done = [(sign * c.value, c.number) for c in curves.curves
            if c.state == "COMPLETE" and c.value is not None]
    return [number for _, number in sorted(done)[:k]]


def replay(curves: StudyCurves, setting: PrunerSetting, top_k: int = 5,
           current: bool = False) -> ReplayResult:
    """Feed the stored curves, in trial order, to ``setting``'s pruner (see the module doc)."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # PatientPruner
    ran_with = curves.config.get("pruner", {})
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(), study_name=curves.study,
        direction="maximize" if curves.direction == "maximize" else "minimize",
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=setting.build(ran_with))
    outcomes: dict[int, str] = {}
    pruned_at: dict[int, int] = {}
    reached: dict[int, int] = {}  # the step each replayed trial ran to
    next_number = curves.first_number
    for curve in curves.curves:
        while next_number < curve.number:  # a gap in the numbers (deleted trials): keep aligned
            study.tell(study.ask(), state=TrialState.FAIL)
            next_number += 1
        trial = study.ask()
        next_number += 1
        if curve.state not in ("COMPLETE", "PRUNED"):  # failed or unfinished: values, no decision
            for step, value in curve.steps:
                trial.report(value, step)
            study.tell(trial, state=TrialState.FAIL)
            continue
        for step, value in curve.steps:
            trial.report(value, step)
            if trial.should_prune():
                pruned_at[curve.number] = step
                break
        if curve.number in pruned_at:
            outcomes[curve.number] = "pruned"
            reached[curve.number] = pruned_at[curve.number]
            study.tell(trial, state=TrialState.PRUNED)
        elif curve.state == "COMPLETE":
            outcomes[curve.number] = "complete"
            reached[curve.number] = curve.steps[-1][0] if curve.steps else 0
            study.tell(trial, curve.value)
        else:  # pruned for real, not by this setting: how it would go on is unknown
            outcomes[curve.number] = "unknown"
            reached[curve.number] = curves.full_step
            study.tell(trial, state=TrialState.PRUNED)
    return _score(curves, setting, outcomes, pruned_at, reached, top_k, current)


def _score(curves: StudyCurves, setting: PrunerSetting, outcomes: dict[int, str],
           pruned_at: dict[int, int], reached: dict[int, int], top_k: int,
           current: bool) -> ReplayResult:
    by_number = {c.number: c for c in curves.curves}
    replayed = [by_number[n] for n in outcomes]
    gpu_s = sum(by_number[n].cost_s(step) for n, step in reached.items())
    actual = sum(c.cost_s(c.steps[-1][0] if c.steps else 0) for c in replayed)
    startup = sum(c.overhead_s + c.worker_s for c in replayed)
    steps_run = sum(sum(1 for s, _ in by_number[n].steps if s <= step) if outcomes[n] != "unknown"
                    else len(by_number[n].steps) for n, step in reached.items())
    completed = [by_number[n].value for n, outcome in outcomes.items() if outcome == "complete"]
    best = (min if curves.direction == "minimize" else max)(
        (v for v in completed if v is not None), default=None)
    top = top_trials(curves, top_k)
    agree = sum(1 for c in replayed if (outcomes[c.number] == "complete" and c.state == "COMPLETE")
                or (outcomes[c.number] == "pruned" and c.state == "PRUNED"
                    and c.steps and pruned_at[c.number] == c.steps[-1][0]))
    return ReplayResult(
        setting=setting, current=current, outcomes=outcomes, prune_steps=pruned_at,
        trials=len(replayed), prune_rate=len(pruned_at) / len(replayed) if replayed else 0.0,
        median_prune_step=statistics.median(pruned_at.values()) if pruned_at else None,
        steps_run=steps_run, gpu_s=gpu_s, gpu_s_saved=actual - gpu_s,
        startup_share=startup / gpu_s if gpu_s > 0 else None, top_k=top,
        top_k_kept=[n for n in top if outcomes.get(n) == "complete"], best_value=best,
        agreement=agree / len(replayed) if replayed else None,
        unknown=sum(1 for o in outcomes.values() if o == "unknown"))


# --- the grid and the advice -----------------------------------------------------------------


def current_setting(config: dict[str, Any]) -> PrunerSetting | None:
    """The setting the study ran with (from its hpo.config), if its pruner is replayed and
    every option the replay varies was a number (``min_resource=auto`` is no point of a
    grid)."""
    pruner = config.get("pruner", {})
    name = pruner.get("name")
    replay: Replay | None = getattr(PRUNERS.get(name), "REPLAY", None)
    if replay is None or not all(isinstance(pruner.get(o.name), int) for o in replay.varied):
        return None
    return PrunerSetting(name, **{o.name: pruner.get(o.name) for o in replay.varied})


def default_grid(full_step: int, patience: list[int] | None = None,
                 min_resource: list[int] | None = None,
                 reduction_factor: list[int] | None = None) -> list[PrunerSetting]:
    """Every registered pruner's grid (its config's ``REPLAY``, in ``PRUNERS``' order): today
    PatientPruner(Hyperband) over patience x min_resource x reduction_factor, and Median over
    warm-up steps; min_resource and warm-up stay below the full length of a trial. The lists
    given replace the grid's values of the option of that name, whichever pruner has it."""
    given = {"patience": patience, "min_resource": min_resource, "reduction_factor": reduction_factor}
    return [PrunerSetting(name, **point) for name, kind in PRUNERS.items()
            for point in grid_of(kind, full_step, given)]


def tune(curves: StudyCurves, grid: list[PrunerSetting], top_k: int = 5) -> list[ReplayResult]:
    replayable = [c for c in curves.curves if c.state in ("COMPLETE", "PRUNED") and c.steps]
    if len(replayable) < 2:
        raise ConfigError(f"study {curves.study!r} has {len(replayable)} finished trials with "
                          "intermediate values; a replay needs at least 2",
                          "run more trials whose objective calls trial.report(value, step)")
    current = current_setting(curves.config)
    settings = list(grid) if current is None or current in grid else [current, *grid]
    return [replay(curves, s, top_k, current=s == current) for s in settings]


def recommend(results: list[ReplayResult]) -> tuple[ReplayResult, str]:
    """The setting that keeps the most of the best trials (all of them, ideally) and, among
    those, saves the most device time; ties go to the gentler setting."""
    most_kept = max(len(r.top_k_kept) for r in results)
    keeping = [r for r in results if len(r.top_k_kept) == most_kept]
    choice = max(keeping, key=lambda r: (round(r.gpu_s_saved, 3), -r.prune_rate,
                                         r.setting.patience or 0))
    k = len(choice.top_k)
    best_saving = choice
    current = next((r for r in results if r.current), None)
    # A change must be worth it: keep the setting as run unless another saves a real share more.
    if current is not None and current in keeping and choice.gpu_s_saved - current.gpu_s_saved \
            <= KEEP_CURRENT_WITHIN * max(choice.gpu_s + choice.gpu_s_saved, 1e-9):
        choice = current
    kept = "all" if most_kept == k else f"{most_kept} of"
    top = ", ".join(f"#{n}" for n in choice.top_k)
    if choice is current:
        reason = (f"the setting the study ran with keeps {kept} the {k} best completed trials "
                  f"({top}), and no setting that keeps as many saves more than "
                  f"{KEEP_CURRENT_WITHIN:.0%} of the device time (the most: {best_saving.setting.label()}, "
                  f"{best_saving.gpu_s_saved - current.gpu_s_saved:.0f} s more): keep it")
    else:
        reason = (f"keeps {kept} the {k} best completed trials ({top}) and saves the most device "
                  f"time among those that do: {choice.gpu_s_saved:.0f} s against the study as run, "
                  f"prune rate {choice.prune_rate:.0%}")
        if current is not None:
            lost = [n for n in current.top_k if n not in current.top_k_kept]
            reason += (f"; the setting the study ran with ({current.setting.label()}) keeps "
                       f"{len(current.top_k_kept)} of {k}"
                       + (f", losing {', '.join(f'#{n}' for n in lost)}" if lost else "")
                       + f", and saves {current.gpu_s_saved:.0f} s")
    if choice.startup_share is not None:
        reason += f"; start-up would be {choice.startup_share:.0%} of device time"
    return choice, reason
