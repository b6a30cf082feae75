"""The search's configs: how trials are proposed (``sampler.*``) and stopped early
(``pruner.*``), one dataclass per option of the group, each named in :data:`PRUNERS` or
:data:`SAMPLERS` (the option's file in ``conf/pruner/`` or ``conf/sampler/`` composes it).

A pruner is registered once: its dataclass here, in :data:`PRUNERS`. The dataclass is the
whole of it: its options and checks (``validate``), the Optuna pruner a run builds from it
(``build``), and what ``tune-pruner``'s replay varies and how a setting is shown
(``REPLAY``). The loader's group schema, ``pruner=<name>`` (with or without a
``conf/pruner/<name>.yaml`` showing its defaults), the run's factory, ``tune-pruner`` and the
replay all read them from there (docs/DESIGN.md §3.2 walks it); the config package's face
re-exports what this module exports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias

from hpo_orchestrator.config._checks import _positive_int, _require

if TYPE_CHECKING:
    import optuna

__all__ = ["PRUNERS", "SAMPLERS", "HyperbandPrunerConfig", "MedianPrunerConfig", "NoPrunerConfig",
           "PatientHyperbandPrunerConfig", "PrunerConfig", "RandomSamplerConfig",
           "RankedHalvingPrunerConfig", "Replay", "SamplerConfig", "TPESamplerConfig", "Varied",
           "as_it_ran", "grid_of"]


# --- pruners ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Varied:
    """An option ``tune-pruner``'s replay varies: its config key, its name in a setting's label,
    its letter in the short form (None: left out there), the value a setting that leaves it
    unset gets, and the default grid's values, from the trials' full length (the last step a
    completed trial reached) and the values given on the command line for the key, if any."""

    name: str
    shown: str
    letter: str | None
    default: int
    grid: Callable[[int, Sequence[int] | None], Sequence[int]]


@dataclass(frozen=True)
class Replay:
    """How ``tune-pruner`` replays a pruner: ``short`` names it in a setting's short form
    ('PH p3 m1 r3'), ``varied`` are the options a setting sets (the others are the replayed
    study's own), and ``in_grid`` says whether the default grid holds its settings (False: it
    is replayed only when the study ran with it)."""

    short: str
    varied: tuple[Varied, ...]
    in_grid: bool = True


def grid_of(kind: type, full_step: int, given: Mapping[str, Sequence[int] | None]) -> list[dict[str, int]]:
    """The default grid's points of pruner ``kind`` (each a value per varied option, in the
    order of ``varied``); ``given``: values from the command line by config key."""
    replay: Replay | None = getattr(kind, "REPLAY", None)
    if replay is None or not replay.in_grid:
        return []
    points: list[dict[str, int]] = [{}]
    for option in replay.varied:
        values = list(option.grid(full_step, given.get(option.name)))
        points = [{**point, option.name: value} for point in points for value in values]
    return points


def _as_given(defaults: Sequence[int]) -> Callable[[int, Sequence[int] | None], Sequence[int]]:
    return lambda full, given: list(given or defaults)


def _below_full(defaults: Sequence[int]) -> Callable[[int, Sequence[int] | None], Sequence[int]]:
    """The values below the trials' full length (a first decision at the last step decides
    nothing), or 1 where none is."""
    return lambda full, given: [v for v in (given or defaults) if v < max(full, 2)] or [1]


_HYPERBAND_VARIED = (Varied("min_resource", "min_resource", "m", 1, _below_full((1, 2, 3, 5, 8, 13))),
                     Varied("reduction_factor", "reduction_factor", "r", 3, _as_given((2, 3, 4))))


def _hyperband(config: Any, min_resource: int | None) -> optuna.pruners.HyperbandPruner:
    import optuna  # deferred: `status` and `report` import the config and start fast

    return optuna.pruners.HyperbandPruner(
        min_resource=min_resource or config.min_resource, max_resource=config.max_resource,
        reduction_factor=config.reduction_factor)


PATIENCE_MODES = ("veto", "delay", "reach")
# Studies recorded before patience_mode existed ran Optuna's PatientPruner: veto
UNRECORDED_PATIENCE_MODE = "veto"


def as_it_ran(pruner: Mapping[str, Any]) -> dict[str, Any]:
    """A study's recorded pruner config (``hpo.config``'s ``pruner``) with the options added
    since it ran filled as that run behaved, not with today's defaults (a replay of it, or the
    command that repeats it, must not switch its pruner silently)."""
    ran = dict(pruner)
    if ran.get("name") == "patient_hyperband":
        ran.setdefault("patience_mode", UNRECORDED_PATIENCE_MODE)
    return ran


@dataclass
class PatientHyperbandPrunerConfig:
    """Hyperband held back by patience. ``patience_mode=veto``: Optuna's
    PatientPruner(HyperbandPruner), Hyperband asked only after ``patience`` steps without
    improvement. ``delay``: Hyperband judges every rung, and a trial it would stop gets
    ``patience`` more steps to catch up (pruners/_delayed.py). ``reach`` (the default, chosen
    on paired real runs: docs/QUALITY.md, "Defaults"): as ``veto``, and at Hyperband's rungs a
    trial that cannot reach the study's best value even at the best pace a complete trial kept
    from its step is stopped (pruners/_reach.py).

    The defaults are deliberately less aggressive than patience=2 / min_resource=1, which in a
    real study pruned 86.5 % of trials at steps 1-4 and left GPUs starting trials, not training.
    """

    REPLAY: ClassVar[Replay | None] = Replay("PH", (
        Varied("patience", "patience", "p", 0, _as_given((0, 1, 2, 3, 5, 8))), *_HYPERBAND_VARIED))

    name: str = "patient_hyperband"
    patience: int = 3
    min_delta: float = 0.0
    # veto: Hyperband is asked only after `patience` steps without improvement (a curve that
    # keeps falling is never judged); delay: its verdict is carried out `patience` steps later;
    # reach: veto, and a trial out of reach of the study's best is stopped
    patience_mode: str = "reach"
    # Steps before Hyperband's first decision; auto: chosen from measured start-up and step
    # times so that start-up is at most startup_share of that time (re-chosen as trials finish).
    min_resource: Any = 3
    max_resource: Any = "auto"
    reduction_factor: int = 3
    startup_share: float = 0.25
    # auto: the orchestrator replays the study's finished curves at intervals and switches
    # patience, min_resource and reduction_factor during the run (pruning/_tune_auto.py). Off by
    # default until the time-to-quality benchmark (docs/QUALITY.md) shows it pays.
    tune: str = "off"

    def validate(self, path: str) -> None:
        _require(isinstance(self.patience, int) and self.patience >= 0, f"{path}.patience",
                 f"expected an integer >= 0, got {self.patience!r}",
                 "patience counts steps without improvement before pruning is allowed")
        _require(self.min_delta >= 0, f"{path}.min_delta",
                 f"expected a value >= 0, got {self.min_delta!r}")
        _require(self.patience_mode in PATIENCE_MODES, f"{path}.patience_mode",
                 f"expected veto, delay or reach, got {self.patience_mode!r}",
                 "veto: Hyperband is asked only after `patience` steps without improvement; "
                 "delay: its verdict is carried out `patience` steps later unless the trial "
                 "caught up; reach: veto, and a trial that cannot reach the study's best is "
                 "stopped")
        if self.min_resource != "auto":
            _positive_int(self.min_resource, f"{path}.min_resource")
        _require(isinstance(self.startup_share, (int, float)) and 0 < self.startup_share < 1,
                 f"{path}.startup_share", f"expected a share between 0 and 1, got {self.startup_share!r}",
                 "e.g. pruner.startup_share=0.25 (start-up at most a quarter of the time)")
        _positive_int(self.reduction_factor, f"{path}.reduction_factor", minimum=2)
        _require(self.tune in ("off", "auto"), f"{path}.tune", f"expected auto or off, got {self.tune!r}",
                 "pruner.tune=auto switches the pruner's setting during the run from replays of "
                 "the study's curves; pruner.tune=off keeps the one given")
        _require(self.tune == "off" or self.min_resource != "auto", f"{path}.tune",
                 "pruner.tune=auto and pruner.min_resource=auto both choose min_resource",
                 "give pruner.min_resource a number (the starting value pruner.tune=auto "
                 "replays against), or set pruner.tune=off")
        _validate_max_resource(self, path)

    def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner:
        """With ``min_resource=auto`` the caller passes the value it chose
        (hpo_orchestrator.pruning._auto); before it has one, nothing is pruned."""
        import optuna

        if self.min_resource == "auto" and min_resource is None:
            return optuna.pruners.NopPruner()
        hyperband = _hyperband(self, min_resource)
        if self.patience_mode == "delay":
            from hpo_orchestrator.pruners import DelayedVerdictPruner

            return DelayedVerdictPruner(hyperband, self.patience, self.min_delta, self.reduction_factor)
        patient = optuna.pruners.PatientPruner(hyperband, patience=self.patience, min_delta=self.min_delta)
        if self.patience_mode == "reach":
            from hpo_orchestrator.pruners import OutOfReachPruner

            return OutOfReachPruner(patient, min_resource or self.min_resource, self.min_delta,
                                    self.reduction_factor)
        return patient


@dataclass
class HyperbandPrunerConfig:
    """Optuna's HyperbandPruner alone, with Optuna's defaults: it prunes at each rung without
    waiting for a step without improvement. What Optuna's documentation shows, and the
    pruner of the benchmark's ``optuna-hyperband`` baseline (docs/QUALITY.md), so that ours
    can be run with the same pruner. Replayed only as a study ran with it."""

    REPLAY: ClassVar[Replay | None] = Replay("H", _HYPERBAND_VARIED, in_grid=False)

    name: str = "hyperband"
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3

    def validate(self, path: str) -> None:
        _positive_int(self.min_resource, f"{path}.min_resource")
        _positive_int(self.reduction_factor, f"{path}.reduction_factor", minimum=2)
        _validate_max_resource(self, path)

    def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner:
        return _hyperband(self, None)


def _validate_max_resource(config: PatientHyperbandPrunerConfig | HyperbandPrunerConfig,
                           path: str) -> None:
    if config.max_resource != "auto":
        _positive_int(config.max_resource, f"{path}.max_resource")
        _require(config.min_resource == "auto" or config.min_resource <= config.max_resource,
                 f"{path}.min_resource",
                 f"min_resource ({config.min_resource}) > max_resource ({config.max_resource})",
                 "lower pruner.min_resource or raise pruner.max_resource")


@dataclass
class RankedHalvingPrunerConfig:
    """Successive halving whose first rung and reduction factor the study's own curves choose
    (pruners/_ranked.py): the cheapest ladder under which the ``protect`` best trials no rung
    judged would have gone on at every rung; nothing is pruned before ``min_complete`` such
    trials, and every ``audit_every``-th trial runs to the end unjudged. No patience: on
    curves that keep improving a patient pruner hardly ever prunes, and where early ranks do
    not hold, the ladder starts late or not at all. Replayed only as a study ran with it."""

    REPLAY: ClassVar[Replay | None] = Replay("R", (
        Varied("protect", "protect", "k", 3, _as_given((3,))),
        Varied("min_complete", "min_complete", "n", 10, _as_given((10,))),
        Varied("audit_every", "audit_every", "a", 5, _as_given((5,)))), in_grid=False)

    name: str = "ranked_halving"
    reduction_factors: list[int] = field(default_factory=lambda: [3])
    protect: int = 3
    min_complete: int = 10
    # every audit_every-th trial runs to the end unjudged: evidence no cut selected (0: none)
    audit_every: int = 5

    def validate(self, path: str) -> None:
        _require(isinstance(self.reduction_factors, list) and bool(self.reduction_factors),
                 f"{path}.reduction_factors", f"expected a list of integers >= 2, got "
                 f"{self.reduction_factors!r}", "e.g. pruner.reduction_factors=[2,3,4]")
        for factor in self.reduction_factors:
            _positive_int(factor, f"{path}.reduction_factors", minimum=2)
        _positive_int(self.protect, f"{path}.protect")
        _positive_int(self.min_complete, f"{path}.min_complete")
        _require(self.audit_every != 1, f"{path}.audit_every",
                 "audit_every=1 judges no trial (every trial would be an audit)",
                 "0 (no audits after the first min_complete trials) or 2 and more")
        _positive_int(self.audit_every, f"{path}.audit_every", minimum=0)
        _require(self.min_complete >= self.protect, f"{path}.min_complete",
                 f"min_complete ({self.min_complete}) < protect ({self.protect})",
                 "the ladder keeps the protect best of at least min_complete complete trials")

    def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner:
        from hpo_orchestrator.pruners import RankedHalvingPruner

        return RankedHalvingPruner(reduction_factors=self.reduction_factors, protect=self.protect,
                                   min_complete=self.min_complete, audit_every=self.audit_every)


def _warmups(full: int, given: Sequence[int] | None) -> Sequence[int]:
    """Warm-up steps below the trials' full length, half of it among them."""
    return sorted({w for w in (given or (0, 1, 3, 5, 10, full // 2)) if w < max(full, 1)})


@dataclass
class MedianPrunerConfig:
    REPLAY: ClassVar[Replay | None] = Replay("median", (
        Varied("n_warmup_steps", "warmup", "w", 0, _warmups),
        Varied("n_startup_trials", "startup_trials", None, 0, _as_given((5,)))))

    name: str = "median"
    n_startup_trials: int = 5
    n_warmup_steps: int = 3
    interval_steps: int = 1

    def validate(self, path: str) -> None:
        _positive_int(self.n_startup_trials, f"{path}.n_startup_trials", minimum=0)
        _positive_int(self.n_warmup_steps, f"{path}.n_warmup_steps", minimum=0)
        _positive_int(self.interval_steps, f"{path}.interval_steps")

    def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.MedianPruner(n_startup_trials=self.n_startup_trials,
                                           n_warmup_steps=self.n_warmup_steps,
                                           interval_steps=self.interval_steps)


@dataclass
class NoPrunerConfig:
    REPLAY: ClassVar[Replay | None] = None  # nothing to replay: every trial runs to its end

    name: str = "none"

    def validate(self, path: str) -> None:
        pass

    def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner:
        import optuna

        return optuna.pruners.NopPruner()


# The pruner group's options, each registered once (the module doc): `pruner=<name>` composes
# the dataclass named here (over conf/pruner/<name>.yaml where that file exists).
PRUNERS: dict[str, type] = {"patient_hyperband": PatientHyperbandPrunerConfig,
                            "hyperband": HyperbandPrunerConfig,
                            "ranked_halving": RankedHalvingPrunerConfig,
                            "median": MedianPrunerConfig, "none": NoPrunerConfig}


# --- samplers -----------------------------------------------------------------------------


@dataclass
class TPESamplerConfig:
    name: str = "tpe"
    n_startup_trials: int = 10
    seed: int | None = None
    # Optuna's TPESampler options for parallel runs: joint sampling of the parameters, and
    # running trials counted as bad so that parallel asks spread out. On by default: together
    # they reached the default study's 50 % target 1.64x sooner over 10 paired seeds, a run
    # whose raw results were not kept (docs/quality/superseded.md: not rebuildable evidence)
    multivariate: bool = True
    constant_liar: bool = True
    # The history the sampler and pruner see (hpo_orchestrator/study/_storage.py): the newest
    # max_history trials plus the keep_best best COMPLETE ones; null: every trial of the study.
    max_history: int | None = 5000
    keep_best: int = 100

    def validate(self, path: str) -> None:
        _positive_int(self.n_startup_trials, f"{path}.n_startup_trials", minimum=0)
        _validate_history(self, path)


@dataclass
class RandomSamplerConfig:
    name: str = "random"
    seed: int | None = None
    max_history: int | None = 5000  # as for tpe (the pruner reads the same history)
    keep_best: int = 100

    def validate(self, path: str) -> None:
        _validate_history(self, path)


def _validate_history(cfg: TPESamplerConfig | RandomSamplerConfig, path: str) -> None:
    if cfg.max_history is not None:
        _positive_int(cfg.max_history, f"{path}.max_history")
    _positive_int(cfg.keep_best, f"{path}.keep_best", minimum=0)


SAMPLERS: dict[str, type] = {"tpe": TPESamplerConfig, "random": RandomSamplerConfig}

if TYPE_CHECKING:
    class PrunerConfig(Protocol):
        """What every dataclass of :data:`PRUNERS` has (the module doc)."""

        REPLAY: ClassVar[Replay | None]
        name: str

        def validate(self, path: str) -> None: ...

        def build(self, min_resource: int | None = None) -> optuna.pruners.BasePruner: ...

    SamplerConfig: TypeAlias = TPESamplerConfig | RandomSamplerConfig
else:
    # OmegaConf cannot type a node as a union of dataclasses: at run time the node is untyped
    # and the group's own schema (base_<option>, registered in config/_load.py) types it.
    PrunerConfig = SamplerConfig = Any
