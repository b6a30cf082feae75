"""What ``tune-pruner`` replays and recommends (pruning/_replay.py), from its promises, for the
mutants mutmut found unguarded (docs/MUTATION.md, "mutmut"): the study's best completed trials
in its direction, the setting it ran with replayed beside the grid (once), the grid's values
given on the command line, at least two finished curves, the ``top_k`` asked for; the
recommendation's ties (device time to the millisecond, then the lower prune rate, then the
gentler patience), the setting as run kept unless another saves more than
KEEP_CURRENT_WITHIN, and its reason in words."""

from __future__ import annotations

import warnings

import optuna
import pytest

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.pruning import (
    PrunerSetting,
    ReplayResult,
    StudyCurves,
    TrialCurve,
    default_grid,
    recommend,
    tune,
)
from hpo_orchestrator.pruning._replay import _replay_of, current_setting, replay, top_trials

AS_RUN = {"pruner": {"name": "patient_hyperband", "patience": 3, "min_resource": 1,
                     "reduction_factor": 3, "max_resource": "auto"}}
P3 = PrunerSetting("patient_hyperband", patience=3, min_resource=1, reduction_factor=3)
P0 = PrunerSetting("patient_hyperband", patience=0, min_resource=1, reduction_factor=3)
P1 = PrunerSetting("patient_hyperband", patience=1, min_resource=1, reduction_factor=3)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _curve(number: int, state: str = "COMPLETE", value: float | None = None,
           steps: int = 4) -> TrialCurve:
    values = tuple((s, number + 1.0 / s) for s in range(1, steps + 1))
    final = values[-1][1] if value is None and state == "COMPLETE" else value
    return TrialCurve(number, state, final, values, 1.0, 1.0)


def _curves(*curves: TrialCurve, direction: str = "minimize",
            config: dict | None = None) -> StudyCurves:  # type: ignore[type-arg]
    return StudyCurves("hpo", direction, AS_RUN if config is None else config, list(curves))


# --- the study's best, and what is replayed --------------------------------------------------

def test_the_best_trials_are_the_completed_ones_in_the_studys_direction() -> None:
    curves = [_curve(0, value=3.0), _curve(1, value=1.0), _curve(2, value=2.0),
              _curve(3, "PRUNED", value=0.5)]  # a pruned trial's value is no result
    assert top_trials(_curves(*curves), 2) == [1, 2]
    assert top_trials(_curves(*curves, direction="maximize"), 2) == [0, 2]


def test_the_setting_as_run_is_replayed_once_beside_the_grid() -> None:
    curves = _curves(_curve(0), _curve(1, "PRUNED"), _curve(2))
    beside = tune(curves, [P0, P1])
    assert [r.setting for r in beside] == [P3, P0, P1] and [r.current for r in beside] == [
        True, False, False]
    within = tune(curves, [P0, P3])
    assert [r.setting for r in within] == [P0, P3] and within[1].current
    unknown = tune(_curves(_curve(0), _curve(1), config={}), [P0])
    assert [r.setting for r in unknown] == [P0] and not unknown[0].current


def test_the_best_trials_kept_are_as_many_as_asked() -> None:
    curves = _curves(*(_curve(n) for n in range(7)))
    assert [len(r.top_k) for r in tune(curves, [P0])] == [5, 5]
    assert [len(r.top_k) for r in tune(curves, [P0], top_k=2)] == [2, 2]


def test_a_replay_needs_two_finished_curves() -> None:
    two = _curves(_curve(0), _curve(1, "PRUNED"), _curve(2, "FAIL"))
    assert len(tune(two, [P0])) == 2
    with pytest.raises(ConfigError) as refused:
        tune(_curves(_curve(0), _curve(1, "FAIL"), _curve(2, value=1.0, steps=0)), [P0])
    assert (refused.value.message, refused.value.hint) == (
        "study 'hpo' has 1 finished trials with intermediate values; a replay needs at least 2",
        "run more trials whose objective calls trial.report(value, step)")


def test_the_setting_as_run_is_known_only_from_numbers() -> None:
    assert current_setting(AS_RUN) == P3
    assert current_setting({}) is None
    assert current_setting({"pruner": {"name": "gone"}}) is None
    auto = {"pruner": {**AS_RUN["pruner"], "min_resource": "auto"}}
    assert current_setting(auto) is None


@pytest.mark.parametrize("option", ["patience", "min_resource", "reduction_factor"])
def test_the_values_given_replace_the_grids(option: str) -> None:
    grid = default_grid(12, **{option: [7]})
    assert {getattr(s, option) for s in grid if s.kind == "patient_hyperband"} == {7}


def test_a_settings_short_name() -> None:
    assert P3.short() == "PH p3 m1 r3"
    assert PrunerSetting("median", n_warmup_steps=2, n_startup_trials=5).short() == "median w2"


# --- the recommendation ---------------------------------------------------------------------

def _scored(setting: PrunerSetting, saved: float, prune_rate: float = 0.5, current: bool = False,
            kept: list[int] | None = None, gpu_s: float = 100.0) -> ReplayResult:
    top = [1, 2]
    return ReplayResult(setting, current, {}, {}, 4, prune_rate, None, 10, gpu_s, saved, None,
                        top, top if kept is None else kept, 0.1)


def test_ties_go_to_the_lower_prune_rate_then_the_gentler_patience() -> None:
    """Savings equal to the millisecond (10.0004 s and 10.0001 s): the lower prune rate wins;
    equal in that too: the higher patience."""
    calmer = _scored(P0, 10.0001, prune_rate=0.25)
    assert recommend([_scored(P1, 10.0004, prune_rate=0.5), calmer])[0] is calmer
    gentle = _scored(P1, 10.0)
    assert recommend([_scored(P0, 10.0), gentle])[0] is gentle


def test_the_setting_as_run_stays_unless_another_saves_more_than_5_percent() -> None:
    """P0 saves 5 s more of 100 (its 95 s and the 5 saved): exactly 5 %, not more."""
    as_run = _scored(P3, 0.0, current=True, gpu_s=100.0)
    choice, reason = recommend([as_run, _scored(P0, 5.0, gpu_s=95.0)])
    assert choice is as_run
    assert reason == ("the setting the study ran with keeps all the 2 best completed trials (#1, "
                      "#2), and no setting that keeps as many saves more than 5% of the device time "
                      "(the most: patient_hyperband(patience=0, min_resource=1, reduction_factor=3), "
                      "5 s more): keep it")
    tiny = _scored(P3, 0.0, current=True, gpu_s=0.6)  # a study of 0.6 device seconds
    assert recommend([tiny, _scored(P0, 0.04, gpu_s=0.56)])[0] is not tiny


def test_the_reason_names_what_the_setting_as_run_keeps_and_loses() -> None:
    keeps = _scored(P3, 0.0, current=True)
    _, reason = recommend([keeps, _scored(P0, 50.0, gpu_s=50.0)])
    assert reason == ("keeps all the 2 best completed trials (#1, #2) and saves the most device "
                      "time among those that do: 50 s against the study as run, prune rate 50%; the "
                      "setting the study ran with (patient_hyperband(patience=3, min_resource=1, "
                      "reduction_factor=3)) keeps 2 of 2, and saves 0 s")
    loses = _scored(P3, 0.0, current=True, kept=[])
    _, reason = recommend([loses, _scored(P0, 50.0, gpu_s=50.0)])
    assert reason.endswith("keeps 0 of 2, losing #1, #2, and saves 0 s")


def test_one_setting_replayed_alone_is_judged_as_in_the_grid() -> None:
    """``replay`` called alone (its defaults) gives a setting what ``tune`` gives it: the same
    5 best trials to keep, and not marked as the setting the study ran with."""
    curves = _curves(*(_curve(n, value=float(n)) for n in range(8)))
    alone = replay(curves, P0)
    assert alone.top_k == [0, 1, 2, 3, 4] and not alone.current
    assert alone == next(r for r in tune(curves, [P0]) if r.setting == P0)


def test_a_replay_silences_optunas_experimental_warning_only() -> None:
    """PatientPruner is experimental in Optuna: the replay hides that warning, and no other
    (the filter is the process's: a caller's own warnings must still show)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replay(_curves(_curve(0), _curve(1)), P0)
        warnings.warn("the caller's own", UserWarning, stacklevel=1)
        warnings.warn("experimental", optuna.exceptions.ExperimentalWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["the caller's own"]


def test_a_failed_trial_among_finished_ones_leaves_the_later_ones_replayed() -> None:
    """A failed or unfinished trial reports its values and gets no decision; the replay goes on
    with the trials after it."""
    curves = _curves(_curve(0), _curve(1, "FAIL", value=None), _curve(2), _curve(3, "RUNNING"),
                     _curve(4))
    assert sorted(replay(curves, P0).outcomes) == [0, 2, 4]


def test_a_gap_of_two_trials_judges_the_later_ones_as_if_the_failed_two_were_there() -> None:
    """Hyperband brackets a trial by its number: two deleted trials (#5, #6) are padded so
    that every later trial keeps its number, deciding as the study with them as failed trials
    (a failed trial gets no decision)."""
    def flat(n: int, state: str = "COMPLETE") -> TrialCurve:  # a value per trial, no trend
        steps = () if state == "FAIL" else tuple((s, (n * 7919 % 13) / 13.0) for s in range(1, 10))
        return TrialCurve(n, state, steps[-1][1] if steps else None, steps, 1.0, 1.0)

    hyperband = PrunerSetting("hyperband", min_resource=1, reduction_factor=3)
    kept = [n for n in range(40) if n not in (5, 6)]
    gap = replay(_curves(*(flat(n) for n in kept)), hyperband)
    failed = replay(_curves(*(flat(n) if n in kept else flat(n, "FAIL") for n in range(40))), hyperband)
    assert gap.outcomes == failed.outcomes and "pruned" in gap.outcomes.values()


def test_the_costs_and_steps_of_each_outcome() -> None:
    """Costs (TrialCurve.cost_s): a complete trial to its last step (one that reported none:
    its start-up alone), a pruned one to the step it was pruned at, one with an unknown end
    to the full length; the study as it ran, each to its last stored step; the start-up, the
    worker's included, as a share of the device time; steps run: those up to the decision,
    every stored step of a trial with an unknown end (it may have run past the full length);
    the best value, of the trials the setting lets complete."""
    up = tuple((s, 1.0) for s in range(1, 5))
    curves = _curves(
        TrialCurve(0, "COMPLETE", 1.0, up, 1.0, 1.0, worker_s=2.0),  # a worker's first trial
        TrialCurve(1, "COMPLETE", 5.0, (), 1.0, 1.0),  # reported nothing
        TrialCurve(2, "PRUNED", None, tuple((s, 0.5) for s in range(1, 7)), 1.0, 1.0),
        TrialCurve(3, "COMPLETE", 10.0, tuple((s, 10.0) for s in range(1, 5)), 1.0, 1.0))
    median = PrunerSetting("median", n_warmup_steps=0, n_startup_trials=1)
    result = replay(curves, median)
    assert result.outcomes == {0: "complete", 1: "complete", 2: "unknown", 3: "pruned"}
    assert (result.gpu_s, result.gpu_s_saved) == (7.0 + 1.0 + 5.0 + 2.0, 20.0 - 15.0)
    assert result.startup_share == 6.0 / 15.0
    assert result.steps_run == 4 + 0 + 6 + 1
    assert result.best_value == 1.0  # of the trials it lets complete (#3, pruned, had 10)
    # what really happened: #0 and #1 completed (agree), #3 completed (pruned here), #2 was
    # pruned at its last stored step (here its end is unknown)
    assert result.agreement == 2 / 4
    assert (result.prune_rate, result.median_prune_step) == (1 / 4, 1)
    assert (result.top_k, result.top_k_kept) == ([0, 1, 3], [0, 1])  # #3 is one of the best


def test_the_best_value_is_in_the_studys_direction_and_none_without_a_completed_trial() -> None:
    median = PrunerSetting("median", n_warmup_steps=0, n_startup_trials=1)
    low, high = tuple((s, 1.0) for s in range(1, 5)), tuple((s, 5.0) for s in range(1, 5))
    both = [TrialCurve(0, "COMPLETE", 1.0, low, 1.0, 1.0), TrialCurve(1, "COMPLETE", 5.0, high, 1.0, 1.0)]
    assert replay(_curves(*both, direction="maximize"), median).best_value == 5.0
    assert replay(_curves(*both), median).best_value == 1.0
    pruned = replay(_curves(TrialCurve(0, "PRUNED", None, low, 1.0, 1.0)), median)
    assert pruned.outcomes == {0: "unknown"} and pruned.best_value is None
    failed = replay(_curves(TrialCurve(0, "FAIL", None, low, 1.0, 1.0)), median)  # none replayed
    short = replay(_curves(TrialCurve(0, "COMPLETE", 1.0, ((1, 1.0),), 0.25, 0.5)), median)
    assert short.startup_share == 0.25 / 0.75  # under a second of device time all told
    assert (failed.trials, failed.prune_rate, failed.agreement) == (0, 0.0, None)


def test_a_setting_names_only_the_options_its_pruner_varies() -> None:
    with pytest.raises(ValueError, match="pruner 'median' does not vary min_resource, patience"):
        PrunerSetting("median", patience=1, min_resource=2, n_warmup_steps=1)


def test_an_unset_option_is_its_default_and_an_odd_max_resource_hyperbands_own() -> None:
    """PrunerSetting: "unset: None, the option's default when built"; config: the study's
    max_resource where it is a number, else ("auto" or an odd value) Hyperband's own "auto"."""
    unset = PrunerSetting("patient_hyperband")
    assert unset.patience is None
    built = unset.config({"name": "patient_hyperband", "max_resource": "odd"})
    defaults = {o.name: o.default for o in _replay_of("patient_hyperband").varied}
    assert (built.patience, built.min_resource, built.reduction_factor) == (
        defaults["patience"], defaults["min_resource"], defaults["reduction_factor"])
    assert built.max_resource == "auto"
    assert P0.config({"name": "patient_hyperband", "max_resource": 27}).max_resource == 27


def test_a_private_name_is_no_option_of_a_setting() -> None:
    """``setting.patience`` reads an option; a name with a leading underscore is Python's
    (copy and pickle ask for such names and must hear they are absent)."""
    with pytest.raises(AttributeError, match="_nothing"):
        P0._nothing  # noqa: B018
    assert getattr(P0, "__deepcopy__", "absent") == "absent"


@pytest.mark.parametrize("kind", ["none", "no_such_pruner"])
def test_a_pruner_without_a_replay_is_refused_by_name(kind: str) -> None:
    with pytest.raises(ValueError, match=f"pruner '{kind}' is not replayed"):
        PrunerSetting(kind)
