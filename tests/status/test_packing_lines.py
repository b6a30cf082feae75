"""The words for what trials_per_gpu=auto and objective.device=auto did on a host
(status/_packing_lines.py; the attrs hpo.packing.<host> and hpo.device_choice.<host>,
docs/DESIGN.md §2, docs/HOSTS.md): status's lines, the low_gpu_util finding's sentence and
hold cause, and the share of a GPU's trials that trained on the CPU. Written for the mutants
mutmut found unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

from typing import Any

import pytest

from hpo_orchestrator.status._packing_lines import (
    cpu_share,
    device_choice_line,
    packing_hold,
    packing_lines,
    packing_of_device,
)


def _change(gpu: int, old: int, new: int, n: int = 0) -> dict[str, Any]:
    return {"time": f"t{n}", "gpu": gpu, "from": old, "to": new, "reason": f"why {n}"}


def _entry(host: str = "h", **kw: Any) -> dict[str, Any]:
    """Two GPUs under auto: gpu0 went 1 -> 2 -> 3 and back to 2, held by memory; gpu1 stayed."""
    base: dict[str, Any] = {
        "host": host, "mode": "auto", "target_gpu_util": 85, "max_trials_per_gpu": 8,
        "levels": [{"gpu": 0, "limit": 2, "held": "one more would not fit", "held_by": "memory"},
                   {"gpu": 1, "limit": 1}],
        "changes": [_change(0, 1, 2, 1), _change(0, 2, 3, 2), _change(0, 3, 2, 3)]}
    return {**base, **kw}


# --- packing_lines: status's section ----------------------------------------------------------

def test_an_auto_host_has_a_heading_a_line_per_gpu_and_its_changes() -> None:
    assert packing_lines(_entry()) == [
        "packing on h: trials per GPU measured (trials_per_gpu=auto, the default; target 85% GPU "
        "utilization, at most 8 per GPU; CUDA MPS off)",
        "  gpu0 1 -> 2 -> 3 -> 2, now 2 (held: one more would not fit)",
        "  gpu1 1, now 1",
        "    t1 gpu0 1 -> 2: why 1",
        "    t2 gpu0 2 -> 3: why 2",
        "    t3 gpu0 3 -> 2: why 3"]


def test_an_auto_host_without_targets_changes_or_levels_says_so() -> None:
    entry = {"host": "h", "mode": "auto", "mps": {"active": True}, "levels": None, "changes": None}
    assert packing_lines(entry) == [
        "packing on h: trials per GPU measured (trials_per_gpu=auto, the default; target -% GPU "
        "utilization, at most - per GPU; CUDA MPS on)"]
    assert packing_lines({"host": "h", "mode": "auto", "mps": None})[0].endswith("; CUDA MPS off)")


def test_the_latest_twelve_changes_are_shown() -> None:
    changes = [_change(1, 1, 2, n) for n in range(15)]
    lines = packing_lines(_entry(changes=changes, levels=[]))
    assert [line.split(" ")[4] for line in lines[1:]] == [f"t{n}" for n in range(3, 15)]


def test_fixed_trials_per_gpu_say_nothing_unless_mps_ran() -> None:
    assert packing_lines({"host": "h", "mode": "fixed"}) == []
    assert packing_lines({"host": "h", "mode": "fixed", "mps": {"active": False}}) == []
    assert packing_lines({"host": "h", "mode": "fixed", "mps": {"active": True}}) == [
        "packing on h: fixed trials per GPU (CUDA MPS on)"]


# --- packing_of_device and packing_hold: the low_gpu_util finding ----------------------------

def test_one_gpus_packing_in_a_sentence() -> None:
    """How far auto went (the highest level ever, not the one now) and why it stopped."""
    packing = [_entry("other", levels=[{"gpu": 0, "limit": 5}]), _entry()]
    assert packing_of_device(packing, "h", 0) == (
        "trials_per_gpu=auto ran up to 3 trials at once on it (now 2); it went no higher: one more "
        "would not fit")
    assert packing_of_device(packing, "h", 1) == (
        "trials_per_gpu=auto ran one trial at a time on it (now 1)")
    held = "; it went no higher: one more would not fit"
    assert packing_of_device([_entry(changes=None)], "h", 0) == (
        f"trials_per_gpu=auto ran one trial at a time on it (now 2){held}")
    # a GPU's changes only, never another's
    assert packing_of_device([_entry(changes=[_change(1, 1, 4)])], "h", 0) == (
        f"trials_per_gpu=auto ran one trial at a time on it (now 2){held}")


@pytest.mark.parametrize(("packing", "host"), [
    ([], "h"),
    ([_entry(mode="fixed")], "h"),  # not run by auto
    ([_entry("other")], "h"),  # another host's
    ([_entry(levels=[{"gpu": 1, "limit": 1}])], "h"),  # no level for this GPU
    ([_entry(levels=None)], "h"),
])
def test_a_gpu_auto_did_not_run_has_no_sentence_and_no_hold(packing: list[dict[str, Any]],
                                                           host: str) -> None:
    assert packing_of_device(packing, host, 0) is None
    assert packing_hold(packing, host, 0) is None


def test_a_gpu_of_an_unknown_host_is_read_from_any_auto_entry() -> None:
    """host None (a study written before hosts were recorded): the first auto entry with the GPU."""
    packing = [_entry("a", mode="fixed", levels=[{"gpu": 0, "limit": 7}]), _entry("b")]
    assert packing_of_device(packing, None, 0) == (
        "trials_per_gpu=auto ran up to 3 trials at once on it (now 2); it went no higher: one more "
        "would not fit")
    assert packing_hold(packing, None, 0) == "memory"


def test_what_held_a_gpu_in_a_word() -> None:
    """held_by where the level is held; None where nothing held it or the entry predates it."""
    packing = [_entry("other", levels=[{"gpu": 0, "limit": 2, "held": "x", "held_by": "cpu"}]),
               _entry()]
    assert packing_hold(packing, "h", 0) == "memory"
    assert packing_hold(packing, "h", 1) is None
    assert packing_hold([_entry(levels=[{"gpu": 0, "limit": 2, "held": "x"}])], "h", 0) is None
    assert packing_hold([_entry(levels=[{"gpu": 0, "limit": 2, "held_by": "cpu"}])], "h", 0) is None


# --- device_choice_line and cpu_share: objective.device=auto ---------------------------------

def test_the_latest_measurement_in_a_line() -> None:
    entry = {"host": "vm", "learner": "cuda", "trial": 4, "reason": "cuda faster"}
    assert device_choice_line(entry) == (
        "objective.device=auto on vm: the latest measurement (trial 4) chose the GPU (cuda "
        "learner): cuda faster")
    assert device_choice_line({}) == (
        "objective.device=auto on None: the latest measurement (trial -) chose the GPU (None "
        "learner): -")
    assert device_choice_line({**entry, "learners": {}}) == device_choice_line(entry)
    assert device_choice_line({**entry, "learners": ["cuda"]}) == device_choice_line(entry)


def test_each_gpus_trials_by_learner_in_the_gpus_order() -> None:
    """gpu2 before gpu10; a key that is no GPU index last; counts of a malformed shape left out."""
    entry = {"host": "vm", "learner": "cpu", "trial": 4, "reason": "r",
             "learners": {"x": {"cpu": 1}, "10": {"cuda": 1}, "2": {"cpu": 2, "cuda": 3},
                          "3": "bad"}}
    assert device_choice_line(entry) == (
        "objective.device=auto on vm: the latest measurement (trial 4) chose the CPU: r; trials "
        "trained: gpu2 2 on the CPU, 3 on cuda; gpu10 1 on cuda; gpux 1 on the CPU")


def test_the_share_of_a_gpus_trials_that_trained_on_the_cpu() -> None:
    entry = {"learner": "cuda", "learners": {"0": {"cpu": 1, "cuda": 3}, "1": {"cuda": 2},
                                             "2": {}}}
    assert cpu_share(entry, 0) == 0.25
    assert cpu_share(entry, 1) == 0.0
    assert cpu_share(entry, 2) is None  # no auto trial on it
    assert cpu_share(entry, 3) is None
    assert cpu_share(None, 0) is None
    # an entry from before the counts: the latest measurement alone
    assert cpu_share({"learner": "cpu"}, 0) == 1.0
    assert cpu_share({"learner": "cuda", "learners": {}}, 0) == 0.0
