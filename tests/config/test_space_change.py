"""A changed search space on an existing study (issue 30, item 4): the refusal names only what
changed (``objective.search_space.num_leaves.high: 256 -> 64``, a parameter added or removed),
not both spaces whole, and the two ways on: a new study name, or study.allow_mixed=true."""

from __future__ import annotations

import optuna
import pytest

from hpo_orchestrator.config import load_config
from hpo_orchestrator.config._diff import value_differences
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.study import create_or_load_study

SPACE = "objective.search_space"


def test_a_changed_bound_is_refused_with_only_the_difference_and_the_ways_on() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.InMemoryStorage()
    create_or_load_study(load_config([]), storage)
    changed = [f"{SPACE}.num_leaves.high=64", f"{SPACE}.max_depth.value=6"]
    with pytest.raises(ConfigError) as refused:
        create_or_load_study(load_config(changed), storage)
    message = refused.value.message
    assert message == ("study 'hpo' was run with another objective "
                       f"({SPACE}.num_leaves.high: 256 -> 64; {SPACE}.max_depth.value: None -> 6): "
                       "this run's trials would be mixed with its trials")
    assert refused.value.hint == ("choose another study.name (study.name=hpo-2), or pass "
                                  "study.allow_mixed=true to add them anyway")
    # either way on works
    create_or_load_study(load_config([*changed, "study.name=narrower"]), storage)
    create_or_load_study(load_config([*changed, "study.allow_mixed=true"]), storage)


def test_many_differences_are_counted_past_the_first_few() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.InMemoryStorage()
    create_or_load_study(load_config([]), storage)
    names = ["num_leaves", "max_depth", "min_child_samples", "lambda_l1", "lambda_l2",
             "feature_fraction", "bagging_fraction", "learning_rate"]
    with pytest.raises(ConfigError) as refused:
        create_or_load_study(load_config([f"{SPACE}.{n}.log=true" if n in ("max_depth",
                                          "feature_fraction", "bagging_fraction")
                                          else f"{SPACE}.{n}.log=false" for n in names]), storage)
    assert refused.value.message.count(" -> ") == 6 and "; and 2 more)" in refused.value.message
    assert len(refused.value.message) < 600


def test_value_differences_names_added_and_removed_parameters() -> None:
    old = {"x": {"low": 0, "high": 1}, "y": {"low": 1, "high": 2}}
    new = {"x": {"low": 0, "high": 2}, "z": {"low": 0, "high": 9}}
    assert value_differences("objective.search_space", old, new) == [
        "objective.search_space.x.high: 1 -> 2", "objective.search_space.y: removed",
        "objective.search_space.z: added"]
    assert value_differences("objective.n_rows", 100, 100) == []
    assert value_differences("objective.search_space.k.choices", [1, 2], [1, 3]) == [
        "objective.search_space.k.choices: [1, 2] -> [1, 3]"]
