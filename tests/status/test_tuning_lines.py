"""What status says of pruner.tune=auto (status/_tuning.py; the attrs hpo.pruner_history and
hpo.pruner_tuning, docs/DESIGN.md §2 and §3.10): a heading with the switches and the latest
check, or when the first replay comes; then the latest five switches, each from the old setting
to the new with the replay's evidence. Written for the mutants mutmut found unguarded
(docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

from typing import Any

from hpo_orchestrator.status._model import StateStats, StatusReport
from hpo_orchestrator.status._tuning import pruner_tuning_lines


def _report(**kw: Any) -> StatusReport:
    base: dict[str, Any] = dict(study="s", direction="minimize", n_trials_target=None, states={},
                                prune_rate=None, prune_steps={}, best=None, per_device=[], running=[])
    return StatusReport(**{**base, **kw})


def _setting(patience: int, min_resource: int, reduction_factor: int) -> dict[str, int]:
    return {"patience": patience, "min_resource": min_resource, "reduction_factor": reduction_factor}


def _switch(at: int, old: dict[str, int], new: dict[str, int],
            evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"time": f"t{at}", "at_trial": at, "old": old, "new": new, "reason": "sooner",
            "evidence": evidence}


A, B = _setting(2, 1, 3), _setting(0, 2, 4)
EVIDENCE = {"replayed_trials": 40, "best_trial": 17, "old": {"expected_s_to_best": 120.4},
            "new": {"expected_s_to_best": 80.6}}


def test_a_study_without_tuning_says_nothing() -> None:
    assert pruner_tuning_lines(_report()) == []


def test_before_the_first_replay_it_says_when_it_comes() -> None:
    """The first replay comes at 20 finished trials (COMPLETE or PRUNED) with curves."""
    states = {"COMPLETE": StateStats(count=3), "PRUNED": StateStats(count=4),
              "FAIL": StateStats(count=5), "RUNNING": StateStats(count=2)}
    assert pruner_tuning_lines(_report(pruner_tune=True, states=states)) == [
        "pruner tuning (pruner.tune=auto): 0 switches; no replay yet: the first comes at 20 "
        "finished trials with learning curves (the study has 7 finished)"]
    assert pruner_tuning_lines(_report(pruner_tune=True, states={"PRUNED": StateStats(count=4)})) == [
        "pruner tuning (pruner.tune=auto): 0 switches; no replay yet: the first comes at 20 "
        "finished trials with learning curves (the study has 4 finished)"]
    assert pruner_tuning_lines(_report(pruner_tune=True, states={"COMPLETE": StateStats(count=3)}))[0] \
        .endswith("(the study has 3 finished)")


def test_the_latest_check_and_one_switch_with_its_evidence() -> None:
    tuning = {"time": "t9", "decision": "kept", "reason": "within 5 %", "replayed_trials": 50}
    lines = pruner_tuning_lines(_report(pruner_history=[_switch(30, A, B, EVIDENCE)],
                                        pruner_tuning=tuning))
    assert lines == [
        "pruner tuning (pruner.tune=auto): 1 switch; latest check at t9 (50 trials): kept, "
        "within 5 %",
        "  t30 at trial 30: patience=2 min_resource=1 reduction_factor=3 -> patience=0 "
        "min_resource=2 reduction_factor=4 (expected device time to the best 120 s -> 81 s, "
        "40 trials replayed, best #17 kept)"]


def test_a_switch_from_history_alone_of_a_study_no_longer_tuned_is_shown() -> None:
    """Recorded switches are shown where the study (or this run) no longer tunes."""
    lines = pruner_tuning_lines(_report(pruner_history=[_switch(30, A, B)]))
    assert lines[0].startswith("pruner tuning (pruner.tune=auto): 1 switch; no replay yet")
    assert lines[1] == ("  t30 at trial 30: patience=2 min_resource=1 reduction_factor=3 -> "
                        "patience=0 min_resource=2 reduction_factor=4")
    assert pruner_tuning_lines(_report(pruner_tuning={"decision": "failed"}))[0].startswith(
        "pruner tuning (pruner.tune=auto): 0 switches; latest check at None (None trials): failed")


def test_the_evidence_without_the_old_settings_time_or_the_counts() -> None:
    """The expected time to the best is said where the replay gave the new setting's; the old
    one's only where it has one; trials replayed unknown: '?'."""
    only_new = {"new": {"expected_s_to_best": 80.4}, "old": {"device_s": 3.0}}
    [_, line] = pruner_tuning_lines(_report(pruner_history=[_switch(30, A, B, only_new)]))
    assert line.endswith("reduction_factor=4 (expected device time to the best 80 s, ? trials "
                         "replayed, best #None kept)")
    no_time = {"new": {"device_s": 3.0}, "old": {"expected_s_to_best": 9.0}}
    [_, line] = pruner_tuning_lines(_report(pruner_history=[_switch(30, A, B, no_time)]))
    assert line.endswith("reduction_factor=4")
    no_sides = {"replayed_trials": 40, "old": None, "new": None}
    [_, line] = pruner_tuning_lines(_report(pruner_history=[_switch(30, A, B, no_sides)]))
    assert line.endswith("reduction_factor=4")


def test_the_latest_five_switches_are_shown() -> None:
    history = [_switch(n, A, B) for n in range(7)]
    lines = pruner_tuning_lines(_report(pruner_history=history, pruner_tune=True))
    assert lines[0].startswith("pruner tuning (pruner.tune=auto): 7 switches; ")
    assert [line.split(" ")[2] for line in lines[1:]] == ["t2", "t3", "t4", "t5", "t6"]


def test_a_setting_without_a_key_says_none() -> None:
    [_, line] = pruner_tuning_lines(_report(pruner_history=[_switch(3, {}, {"patience": 1})]))
    assert line == ("  t3 at trial 3: patience=None min_resource=None reduction_factor=None -> "
                    "patience=1 min_resource=None reduction_factor=None")
