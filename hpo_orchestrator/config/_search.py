"""The search's configs: how trials are proposed (``sampler.*``) and stopped early
(``pruner.*``), one dataclass per option of the group, each named in :data:`PRUNERS` or
:data:`SAMPLERS` (the option's file in ``conf/pruner/`` or ``conf/sampler/`` composes it).

A new pruner is its dataclass here (with its entry in :data:`PRUNERS` and
:data:`PrunerConfig`), its ``conf/pruner/<name>.yaml``, and its branch in
pruning/_factory.py's ``build_pruner`` (docs/DESIGN.md §3.2 walks it): the config package's
face re-exports what this module exports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from hpo_orchestrator.config._checks import _positive_int, _require

__all__ = ["PRUNERS", "SAMPLERS", "HyperbandPrunerConfig", "MedianPrunerConfig", "NoPrunerConfig",
           "PatientHyperbandPrunerConfig", "PrunerConfig", "RandomSamplerConfig",
           "RankedHalvingPrunerConfig", "SamplerConfig", "TPESamplerConfig"]


# --- pruners ------------------------------------------------------------------------------


@dataclass
class PatientHyperbandPrunerConfig:
    """PatientPruner(HyperbandPruner): prune only after ``patience`` steps without improvement.

    The defaults are deliberately less aggressive than patience=2 / min_resource=1, which in a
    real study pruned 86.5 % of trials at steps 1-4 and left GPUs starting trials, not training.
    """

    name: str = "patient_hyperband"
    patience: int = 3
    min_delta: float = 0.0
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


@dataclass
class HyperbandPrunerConfig:
    """Optuna's HyperbandPruner alone, with Optuna's defaults: it prunes at each rung without
    waiting for a step without improvement. What Optuna's documentation shows, and the
    pruner of the benchmark's ``optuna-hyperband`` baseline (docs/QUALITY.md), so that ours
    can be run with the same pruner."""

    name: str = "hyperband"
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3

    def validate(self, path: str) -> None:
        _positive_int(self.min_resource, f"{path}.min_resource")
        _positive_int(self.reduction_factor, f"{path}.reduction_factor", minimum=2)
        _validate_max_resource(self, path)


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
    (pruning/_ranked.py): the cheapest ladder under which the ``protect`` best trials no rung
    judged would have gone on at every rung; nothing is pruned before ``min_complete`` such
    trials, and every ``audit_every``-th trial runs to the end unjudged. No patience: on
    curves that keep improving a patient pruner hardly ever prunes, and where early ranks do
    not hold, the ladder starts late or not at all."""

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


@dataclass
class MedianPrunerConfig:
    name: str = "median"
    n_startup_trials: int = 5
    n_warmup_steps: int = 3
    interval_steps: int = 1

    def validate(self, path: str) -> None:
        _positive_int(self.n_startup_trials, f"{path}.n_startup_trials", minimum=0)
        _positive_int(self.n_warmup_steps, f"{path}.n_warmup_steps", minimum=0)
        _positive_int(self.interval_steps, f"{path}.interval_steps")


@dataclass
class NoPrunerConfig:
    name: str = "none"

    def validate(self, path: str) -> None:
        pass


# The pruner group's options: conf/pruner/<name>.yaml composes the dataclass named here.
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
    PrunerConfig: TypeAlias = (PatientHyperbandPrunerConfig | HyperbandPrunerConfig
                               | RankedHalvingPrunerConfig | MedianPrunerConfig | NoPrunerConfig)
    SamplerConfig: TypeAlias = TPESamplerConfig | RandomSamplerConfig
else:
    # OmegaConf cannot type a node as a union of dataclasses: at run time the node is untyped
    # and the group's own schema (base_<option>, registered in config/_load.py) types it.
    PrunerConfig = SamplerConfig = Any
