"""tune-pruner's ``run`` command (pruning/_command.py) from its promise, for the mutants mutmut
found unguarded (docs/MUTATION.md, "mutmut"): only the settings that differ from the defaults
of the study's own objective, sampler and pruner, the budget (``add_trials`` where the study
was given one), a name the storage does not hold, and values Hydra reads back as they were."""

from __future__ import annotations

import pytest

from hpo_orchestrator.config import load_config
from hpo_orchestrator.config._load import to_plain_dict
from hpo_orchestrator.pruning._command import _MISSING, _at, _value, recommended_command

EAGER = "pruner=patient_hyperband pruner.patience=0 pruner.min_resource=1 pruner.reduction_factor=3"


def test_only_what_differs_from_the_studys_own_defaults_is_given() -> None:
    """torch_mlp's, random's and patient_hyperband's own defaults are left out (the base
    config's lightgbm, tpe and defaults would differ from them); the study's patience_mode is
    kept; the third free name is taken."""
    recorded = to_plain_dict(load_config([
        "objective=torch_mlp", "sampler=random", "scheduler.parallel=4", "study.n_trials=30",
        "pruner=patient_hyperband", "pruner.patience_mode=delay"]))
    taken = {"hpo-patient-hyperband", "hpo-patient-hyperband-2"}
    assert recommended_command("hpo-orchestrator", "hpo", recorded, EAGER, taken) == (
        "hpo-orchestrator run objective=torch_mlp sampler=random study.n_trials=30 "
        "scheduler.parallel=4 pruner=patient_hyperband pruner.patience=0 pruner.min_resource=1 "
        "pruner.reduction_factor=3 pruner.patience_mode=delay study.name=hpo-patient-hyperband-3")


def test_a_study_recorded_before_patience_mode_is_repeated_with_the_mode_it_ran() -> None:
    """Its PatientPruner was veto; today's default is reach: the command says veto."""
    recorded = to_plain_dict(load_config([]))
    del recorded["pruner"]["patience_mode"]
    command = recommended_command("hpo-orchestrator", "hpo", recorded, EAGER, set())
    assert " pruner.patience_mode=veto " in command
    recorded["pruner"]["patience_mode"] = "reach"  # today's default: not given
    assert "patience_mode" not in recommended_command("hpo-orchestrator", "hpo", recorded, EAGER, set())


def test_a_study_given_add_trials_gets_them_as_its_budget() -> None:
    recorded = to_plain_dict(load_config([]))
    recorded["study"].update(n_trials=None, add_trials=20)
    command = recommended_command("hpo-orchestrator", "hpo", recorded, EAGER, set())
    assert " study.n_trials=20 " in command


@pytest.mark.parametrize(("value", "typed"), [
    (None, "null"), (True, "true"), (False, "false"), (3, "3"), (0.5, "0.5"),
    ([1, "a b"], "[1,'a b']"), ({"low": 1, "high": "x y"}, "{low:1,high:'x y'}"),
    ("plain/path:1", "plain/path:1"), ("null", "'null'"), ("true", "'true'"), ("false", "'false'"),
    ("it's a\\b", "'it\\'s a\\\\b'"),
])
def test_values_are_typed_as_hydra_reads_them_back(value: object, typed: str) -> None:
    assert _value(value) == typed


def test_a_path_through_a_value_that_is_no_section_is_missing() -> None:
    assert _at({"a": "xyz"}, "a.x") is _MISSING  # a string holds no key, even a letter of it
    assert _at({"a": None}, "a.b") is _MISSING
    assert _at({"a": {"b": 2}}, "a.b") == 2


def test_a_study_run_elsewhere_gets_the_groups_budget_and_pruner_alone() -> None:
    """``recorded`` is empty for a study run elsewhere (no ``hpo.config``): the command is the
    recommendation and the new name, nothing taken from sections the study does not have."""
    assert recommended_command("hpo-orchestrator", "hpo", {}, EAGER, set()) == (
        "hpo-orchestrator run pruner=patient_hyperband pruner.patience=0 pruner.min_resource=1 "
        "pruner.reduction_factor=3 study.name=hpo-patient-hyperband")


def test_the_kept_pruner_options_are_those_differing_from_that_pruners_own_defaults() -> None:
    """A study run with the median pruner at its own defaults, recommended the median pruner
    with another warm-up: no other median option is given (the patient_hyperband of the base
    config has none of them, so they would all differ from it); one the study changed is."""
    recorded = to_plain_dict(load_config(["pruner=median", "scheduler.parallel=2"]))
    command = recommended_command("hpo-orchestrator", "hpo", recorded, "pruner=median "
                                  "pruner.n_warmup_steps=5", set())
    assert command == ("hpo-orchestrator run objective=lightgbm sampler=tpe study.n_trials="
                       f"{recorded['study']['n_trials']} scheduler.parallel=2 pruner=median "
                       "pruner.n_warmup_steps=5 study.name=hpo-median")
    recorded["pruner"]["interval_steps"] = 2
    command = recommended_command("hpo-orchestrator", "hpo", recorded, "pruner=median "
                                  "pruner.n_warmup_steps=5", set())
    assert command.endswith(" pruner=median pruner.n_warmup_steps=5 pruner.interval_steps=2 "
                            "study.name=hpo-median")
