"""Each finding's rule at its bounds and in its words (status/_findings.py, docs/DESIGN.md §5 and
docs/RECORDING.md's table): when it fires, what it says, the numbers it keeps as evidence and
what it advises. Built from plain reports and facts, no study: written for the mutants mutmut
found unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

from typing import Any

import pytest

from hpo_orchestrator.status._findings import (
    _AUTO_ADVICE,
    _HOLD_ADVICE,
    _LOW_UTIL_ADVICE,
    _aggressive_pruning,
    _auto_advice,
    _failing_trials,
    _gpu_unused,
    _idle_advice,
    _idle_gpus,
    _low_utilization,
    _oom,
    _params_differ,
    _shared_cores,
    _slow_startup,
    _stale_running,
    find_all,
)
from hpo_orchestrator.status._model import DeviceUse, Finding, StateStats, StatusReport, StudyFacts


def _report(**kw: Any) -> StatusReport:
    base: dict[str, Any] = dict(study="s", direction="minimize", n_trials_target=None, states={},
                                prune_rate=None, prune_steps={}, best=None, per_device=[], running=[])
    return StatusReport(**{**base, **kw})


def _facts(**kw: Any) -> StudyFacts:
    base: dict[str, Any] = dict(config={}, max_complete_step=None, unverified=[], mismatches=[])
    return StudyFacts(**{**base, **kw})


def _gpu(index: int = 0, host: str = "h", **kw: Any) -> DeviceUse:
    """A GPU idle by idle_gpu's rule unless told otherwise: busy 50 % of 100 s, 25 % of the
    40 s trials waited, 4 trials (30 s empty, 6 s a trial)."""
    base: dict[str, Any] = dict(trials=4, busy_fraction=0.5, busy_fraction_queued=0.25,
                                active_s=100.0, active_queued_s=40.0)
    return DeviceUse(device=f"gpu{index}", host=host, gpu_index=index, **{**base, **kw})


# --- failing_trials ---------------------------------------------------------------------------

def test_failing_trials_groups_messages_by_their_masked_numbers() -> None:
    """``diverged at x=4.41`` and ``x=0.78`` are one cause, shown masked with one message
    quoted whole; a cause of one message quotes it; interrupted trials are not counted."""
    [found] = _failing_trials(_facts(failures=[
        (3, "exception", "diverged at x=4.41"),
        (5, "interrupted", None),
        (7, "exception", "diverged at x=0.78"),
        (9, "exception", "no data"),
    ]))
    assert (found.code, found.severity) == ("failing_trials", "warning")
    assert found.message == ("3 trials failed: 2 x diverged at x=# (the numbers vary; e.g. trial 3: "
                             "diverged at x=4.41); 1 x no data (e.g. trial 9)")
    assert found.advice == ("'hpo-orchestrator logs 3' shows that trial's output and traceback "
                            "('hpo-orchestrator status --trial 3' its params)")
    assert found.evidence == {"failed": 3, "errors": [
        {"error": "diverged at x=4.41", "pattern": "diverged at x=#", "count": 2, "example_trial": 3},
        {"error": "no data", "pattern": "no data", "count": 1, "example_trial": 9}]}


def test_one_message_repeated_is_quoted_whole_not_masked() -> None:
    [found] = _failing_trials(_facts(failures=[(1, "exception", "step 3 failed"),
                                               (2, "exception", "step 3 failed")]))
    assert found.message == "2 trials failed: 2 x step 3 failed (e.g. trial 1)"


def test_one_failed_trial_is_singular_and_a_trial_without_an_error_gives_its_reason() -> None:
    [found] = _failing_trials(_facts(failures=[(4, "timeout", None)]))
    assert found.message == "1 trial failed: 1 x timeout (e.g. trial 4)"
    [found] = _failing_trials(_facts(failures=[(4, None, None)]))
    assert found.message == "1 trial failed: 1 x unknown (e.g. trial 4)"


def test_only_interrupted_trials_are_no_finding() -> None:
    assert _failing_trials(_facts(failures=[(1, "interrupted", "KeyboardInterrupt")])) == []
    assert _failing_trials(_facts()) == []


def test_the_three_most_common_errors_then_how_many_more() -> None:
    """FAILING_SHOWN = 3 causes named, most common first; the rest counted, trials and messages;
    the advice names the first trial of the most common cause."""
    failures = [(n, "exception", text) for n, text in [
        (1, "d"), (2, "a"), (3, "a"), (4, "a"), (5, "b"), (6, "b"), (7, "c"), (8, "c"), (9, "e")]]
    [found] = _failing_trials(_facts(failures=failures))
    assert found.message == ("9 trials failed: 3 x a (e.g. trial 2); 2 x b (e.g. trial 5); "
                             "2 x c (e.g. trial 7); 2 more with 2 other message(s)")
    assert "'hpo-orchestrator logs 2'" in found.advice
    assert [e["pattern"] for e in found.evidence["errors"]] == ["a", "b", "c"]
    assert found.evidence["failed"] == 9


# --- idle_gpu: the finding itself (_idle_share's bounds: test_findings_lists.py) -----------------

def test_one_idle_gpu_is_named_with_its_busy_shares_and_trials() -> None:
    [found] = _idle_gpus(_report(per_device=[_gpu()]),
                         _facts(config={"scheduler": {"parallel": None}}))
    assert (found.code, found.severity) == ("idle_gpu", "warning")
    assert found.message == ("gpu0 was busy 50% of the 100 s with trials running (25% while trials "
                             "waited to start; 4 trials ran on it)")
    assert found.advice == _idle_advice(None, 1)
    assert found.evidence == {"device": "gpu0", "devices": [
        {"device": "gpu0", "busy_fraction": 0.5, "busy_fraction_queued": 0.25, "active_s": 100.0,
         "trials": 4}], "scheduler.parallel": None}


def test_several_idle_gpus_are_one_finding_other_studies_share_named() -> None:
    """One finding names every idle GPU; another study's trials count as busy, and their share
    is said and kept (only where there was one)."""
    gpus = [_gpu(0, busy_fraction=0.12344, busy_fraction_queued=0.24444, active_s=99.94),
            _gpu(1, trials=2), _gpu(2, busy_fraction=0.9)]  # gpu2 busy enough
    [found] = _idle_gpus(_report(per_device=gpus),
                         _facts(config={"scheduler": {"parallel": 2}},
                                other_studies_s={("h", 1): 4.1}))
    assert found.message == (
        "2 GPUs were busy under 75% of the time with trials running: gpu0 12% (24% while trials "
        "waited to start; 4 trials), gpu1 50% (25% while trials waited to start, other studies' "
        "trials 10%; 2 trials)")
    assert found.evidence["device"] == "gpu0, gpu1"
    assert found.evidence["devices"] == [
        {"device": "gpu0", "busy_fraction": 0.123, "busy_fraction_queued": 0.244, "active_s": 99.9,
         "trials": 4},
        {"device": "gpu1", "busy_fraction": 0.5, "busy_fraction_queued": 0.25, "active_s": 100.0,
         "other_studies_fraction": 0.102, "trials": 2}]
    assert found.evidence["scheduler.parallel"] == 2
    # parallel=2 on a host of 3 GPUs: too few
    assert found.advice.startswith("scheduler.parallel=2 runs fewer trials than this host has GPUs (3)")


def test_one_idle_gpu_with_another_studys_trials_says_their_share() -> None:
    [found] = _idle_gpus(_report(per_device=[_gpu(active_s=None)]),
                         _facts(other_studies_s={("h", 0): 4.0}))
    assert found.message == ("gpu0 was busy 50% of the 0 s with trials running (25% while trials "
                             "waited to start, other studies' trials 10%; 4 trials ran on it)")
    assert found.evidence["devices"][0]["active_s"] == 0
    assert found.evidence["devices"][0]["other_studies_fraction"] == 0.1


def test_parallel_is_compared_with_the_gpus_of_the_idle_gpus_host() -> None:
    """parallel is per host: an idle GPU on a host of 2 GPUs with parallel=3 is not short of
    trials, even where another host has 4 GPUs; the advice takes the largest host of those
    idle. A CPU row (no GPU index) is never an idle GPU."""
    busy = dict(busy_fraction=0.9, busy_fraction_queued=0.9)
    big = [_gpu(i, "big", **busy) for i in range(4)]
    small = [_gpu(0, "small"), _gpu(1, "small", **busy)]
    cpu = DeviceUse(device="cpu", host="small", gpu_index=None, trials=4, busy_fraction=0.1,
                    busy_fraction_queued=0.1, active_s=100.0, active_queued_s=40.0)
    config = {"scheduler": {"parallel": 3}}
    [found] = _idle_gpus(_report(per_device=big + small + [cpu]), _facts(config=config))
    assert found.advice == _idle_advice(3, 2) == _idle_advice(None, 2)
    assert found.evidence["device"] == "gpu0"
    idle_big = [_gpu(0, "big"), *big[1:]]
    [found] = _idle_gpus(_report(per_device=idle_big + small), _facts(config=config))
    assert found.advice == _idle_advice(3, 4)
    assert "(4)" in found.advice


def test_no_idle_gpu_no_finding() -> None:
    assert _idle_gpus(_report(per_device=[_gpu(busy_fraction=0.8)]), _facts()) == []


def test_a_flag_is_not_a_number_of_parallel_trials() -> None:
    """_idle_advice: "only a fixed number can be too few" (True is an int to Python)."""
    assert _idle_advice(True, 4) == _idle_advice(None, 4)
    assert _idle_advice(4, 4) == _idle_advice(None, 4)
    assert _idle_advice(3, 4) != _idle_advice(None, 4)


# --- low_gpu_util -----------------------------------------------------------------------------

def _util(util: float | None = 30.0, mean: float | None = 40.0, index: int | None = 0,
          host: str = "h") -> DeviceUse:
    return DeviceUse(device="gpu0" if index is not None else "cpu", host=host, gpu_index=index,
                     util_compute_mean=util, util_mean=mean)


def test_under_half_utilization_while_training_is_a_warning_with_the_objectives_advice() -> None:
    [found] = _low_utilization(_report(per_device=[_util(49.9)]), {"objective": {"name": "torch_cnn"}})
    assert (found.code, found.severity) == ("low_gpu_util", "warning")
    assert found.message == "gpu0 averaged 50% utilization while training (40% overall)"
    assert found.advice == _LOW_UTIL_ADVICE["default"]
    assert found.evidence == {"device": "gpu0", "util_compute_mean": 49.9, "util_mean": 40.0,
                              "threshold": 50.0, "packing": None}
    [found] = _low_utilization(_report(per_device=[_util(10.0, None)]),
                               {"objective": {"name": "lightgbm"}})
    assert found.message == "gpu0 averaged 10% utilization while training (- overall)"
    assert found.advice == _LOW_UTIL_ADVICE["lightgbm"]
    assert "LightGBM's GPU learners" in _LOW_UTIL_ADVICE["lightgbm"]
    assert "the GPU waits for input" in _LOW_UTIL_ADVICE["default"]
    [found] = _low_utilization(_report(per_device=[_util()]), {})
    assert found.advice == _LOW_UTIL_ADVICE["default"]


@pytest.mark.parametrize("use", [_util(50.0), _util(None), _util(10.0, index=None)])
def test_half_utilization_or_none_measured_or_a_cpu_is_no_finding(use: DeviceUse) -> None:
    assert _low_utilization(_report(per_device=[use]), {}) == []


def _packing(held_by: str | None = "cpu", host: str = "h", limit: int = 2) -> dict[str, Any]:
    level: dict[str, Any] = {"gpu": 0, "limit": limit}
    if held_by:
        level.update(held="the host's cores are all in use", held_by=held_by)
    return {"host": host, "mode": "auto", "levels": [level],
            "changes": [{"gpu": 0, "from": 1, "to": 2, "time": "t", "reason": "r"}]}


def test_a_gpu_that_auto_packed_says_how_far_and_what_held_it() -> None:
    """The low_gpu_util advice follows what held the GPU (hpo.packing's held_by), not the
    feed-it-faster advice, which is for a GPU where more trials did not pay."""
    [found] = _low_utilization(_report(per_device=[_util()], packing=[_packing("memory")]), {})
    said = ("trials_per_gpu=auto ran up to 2 trials at once on it (now 2); it went no higher: "
            "the host's cores are all in use")
    assert found.message == f"gpu0 averaged 30% utilization while training (40% overall); {said}"
    assert found.advice == _HOLD_ADVICE["memory"]
    assert found.evidence["packing"] == said
    assert found.severity == "warning"
    [found] = _low_utilization(_report(per_device=[_util()], packing=[_packing(None)]), {})
    assert found.advice == _AUTO_ADVICE


def test_each_gpu_is_read_from_its_own_hosts_packing() -> None:
    """hpo.packing.<host>: a GPU's level and what held it come from its own host's entry."""
    report = _report(per_device=[_util(host="b")],
                     packing=[_packing("memory", host="a", limit=3), _packing("cpu", host="b")])
    [found] = _low_utilization(report, {})
    assert found.evidence["packing"] == ("trials_per_gpu=auto ran up to 2 trials at once on it (now "
                                         "2); it went no higher: the host's cores are all in use")
    assert found.advice == _HOLD_ADVICE["cpu"]


def test_every_gpu_under_half_is_named_after_one_that_is_not() -> None:
    busy = DeviceUse(device="gpu1", host="h", gpu_index=1, util_compute_mean=80.0, util_mean=80.0)
    assert [f.message.split(" ")[0] for f in _low_utilization(
        _report(per_device=[busy, _util()]), {})] == ["gpu0"]


def test_the_advice_for_each_hold_cause() -> None:
    """_auto_advice: by what held the GPU; nothing known: feed each trial faster."""
    assert _auto_advice(None) == _AUTO_ADVICE
    assert _auto_advice("no_gain") == _AUTO_ADVICE
    assert _auto_advice("cpu").startswith("the host's cores held it")
    assert _AUTO_ADVICE.startswith("more trials per GPU did not fill it")
    assert set(_HOLD_ADVICE) == {"cpu", "memory", "parallel", "max_trials_per_gpu", "measuring"}


def _choice(learners: dict[str, Any], host: str = "h") -> dict[str, Any]:
    return {"host": host, "learner": "cpu", "reason": "cpu 2.0 s, cuda 5.0 s", "learners": learners}


def test_a_gpu_whose_trials_auto_trained_mostly_on_the_cpu_was_not_needed() -> None:
    """objective.device=auto: the finding calls a GPU "not needed" (info) only where most of
    its trials (half or more) trained on the CPU."""
    report = _report(per_device=[_util()], packing=[_packing("cpu")],
                     device_choices=[_choice({"0": {"cpu": 1, "cuda": 1}})])
    [found] = _low_utilization(report, {})
    assert found.severity == "info"
    assert found.message == (
        "gpu0 averaged 30% utilization while training (40% overall); objective.device=auto "
        "measured the CPU faster and trained most of its trials there (cpu 2.0 s, cuda 5.0 s): "
        "the GPU was not needed for these trials")
    assert found.advice == ("nothing to fix for this study; run another study on the GPU, or give "
                            "it scheduler.gpus=none to leave it free")
    report = _report(per_device=[_util()], packing=[_packing("cpu")],
                     device_choices=[_choice({"0": {"cpu": 1, "cuda": 2}})])
    [found] = _low_utilization(report, {})
    assert found.severity == "warning"
    assert found.advice == _HOLD_ADVICE["cpu"]
    assert "trials_per_gpu=auto ran up to 2" in found.message


def test_a_device_choice_is_read_for_the_gpus_own_host() -> None:
    report = _report(per_device=[_util()], device_choices=[_choice({"0": {"cpu": 5}}, host="other"),
                                                           _choice({"0": {"cuda": 5}})])
    [found] = _low_utilization(report, {})
    assert found.severity == "warning"
    assert found.advice == _LOW_UTIL_ADVICE["default"]
    report = _report(per_device=[_util()], device_choices=[_choice({"0": {"cpu": 5}}, host="other")])
    [found] = _low_utilization(report, {})
    assert found.severity == "warning"
    # a choice with no auto trial on this GPU: not on the CPU
    report = _report(per_device=[_util()], device_choices=[_choice({"1": {"cpu": 5}})])
    [found] = _low_utilization(report, {})
    assert found.severity == "warning"
    report = _report(per_device=[_util()], device_choices=[{"host": "h", "learner": "cpu"}])
    [found] = _low_utilization(report, {})
    assert "(-): the GPU was not needed" in found.message


# --- gpu_unused -------------------------------------------------------------------------------

def test_trials_that_showed_no_gpu_work_are_named_with_their_opencl_platforms() -> None:
    [found] = _gpu_unused(_facts(unverified=[(3, "Portable Computing Language"), (5, None),
                                             (8, "Portable Computing Language"), (9, "Clover")]))
    assert (found.code, found.severity) == ("gpu_unused", "warning")
    assert found.message == ("4 trials asked for a GPU that showed no work from them while they "
                             "trained (LightGBM OpenCL platform: Clover, Portable Computing "
                             "Language): #3, #5, #8, #9")
    assert found.advice == ("the work ran on the CPU: for LightGBM keep objective.gpu_platform=auto "
                            "(it picks the NVIDIA OpenCL platform); for torch move the model and "
                            "every batch to 'cuda'")
    assert found.evidence == {"trials": [3, 5, 8, 9],
                              "opencl_platforms": ["Clover", "Portable Computing Language"]}
    [found] = _gpu_unused(_facts(unverified=[(3, None)]))
    assert found.message == ("1 trial asked for a GPU that showed no work from them while they "
                             "trained: #3")
    assert _gpu_unused(_facts()) == []


# --- slow_startup -----------------------------------------------------------------------------

def test_a_start_up_over_a_quarter_of_the_time_to_the_first_decision() -> None:
    [found] = _slow_startup(_facts(startup=(3, 1.0, 4.0), config={"scheduler": {"worker_mode": "fresh"}}))
    assert (found.code, found.severity) == ("slow_startup", "warning")
    assert found.message == ("starting a trial takes 1.0 s, 25% of the 4.0 s until its first "
                             "pruning decision (medians of 3 trials)")
    assert found.advice == ("each start buys little training before the pruner decides: set "
                            "scheduler.worker_mode=reuse (now fresh): imports and set-up once per slot")
    assert found.evidence == {"startup_s_median": 1.0, "first_decision_s_median": 4.0,
                              "share": 0.25, "trials": 3}
    [found] = _slow_startup(_facts(startup=(7, 2.12345, 3.00049)))
    assert found.evidence == {"startup_s_median": 2.123, "first_decision_s_median": 3.0,
                              "share": 0.708, "trials": 7}
    [found] = _slow_startup(_facts(startup=(3, 1.0, 0.5)))  # a decision within the first second
    assert found.message.startswith("starting a trial takes 1.0 s, 200% of the 0.5 s until")


@pytest.mark.parametrize("startup", [
    None,
    (2, 5.0, 6.0),  # fewer than MIN_TRIALS trials with both
    (3, 0.99, 1.0),  # under STARTUP_FLOOR_S
    (3, 1.0, 4.01),  # under a quarter
    (3, 1.0, 0.0),  # no decision time: nothing to compare with
    (3, 1.0, -1.0),
])
def test_a_start_up_short_or_of_few_trials_is_no_finding(startup: Any) -> None:
    assert _slow_startup(_facts(startup=startup)) == []


# --- aggressive_pruning -----------------------------------------------------------------------

def _pruned(rate: float | None = 0.6, steps: dict[int, int] | None = None, complete: int = 1,
            pruned: int = 2, failed: int = 0) -> StatusReport:
    states = {"COMPLETE": StateStats(count=complete), "PRUNED": StateStats(count=pruned)}
    if failed:
        states["FAIL"] = StateStats(count=failed)
    return _report(prune_rate=rate, prune_steps={2: 2} if steps is None else steps, states=states)


def test_most_trials_pruned_early_is_a_warning_naming_the_pruners_keys() -> None:
    pruner = {"name": "median", "n_warmup_steps": 1}
    [found] = _aggressive_pruning(_pruned(steps={1: 1, 2: 2, 9: 1}),
                                  _facts(config={"pruner": pruner}, max_complete_step=10))
    assert (found.code, found.severity) == ("aggressive_pruning", "warning")
    assert found.message == ("60% of finished trials were pruned, half of them by step 2 of 10 "
                             "(3 of 4 in the first 25%)")
    assert found.advice == ("most trials are stopped before they show their level, and GPU time "
                            "goes to starting trials: raise pruner.n_warmup_steps (now "
                            "n_warmup_steps=1); 'hpo-orchestrator tune-pruner' replays this "
                            "study's curves to find a setting")
    assert found.evidence == {"prune_rate": 0.6, "median_prune_step": 2, "max_step": 10,
                              "pruned_early": 3, "pruned": 4}


def test_early_is_at_most_a_quarter_of_the_steps_but_at_least_step_one() -> None:
    """Without a complete trial the longest pruned one gives the steps; step 1 is early even
    where a quarter of the steps is under one; half pruned at exactly a quarter is early."""
    [found] = _aggressive_pruning(_pruned(rate=0.66666, steps={0: 2, 1: 1, 2: 1}), _facts())
    assert found.message == ("67% of finished trials were pruned, half of them by step 0.5 of 2 "
                             "(3 of 4 in the first 25%)")
    assert found.evidence["max_step"] == 2
    assert found.evidence["prune_rate"] == 0.667
    assert found.evidence["median_prune_step"] == 0.5
    assert "raise pruner.patience and pruner.min_resource" in found.advice  # no pruner recorded
    [found] = _aggressive_pruning(_pruned(steps={5: 2, 6: 1}), _facts(max_complete_step=20))
    assert "half of them by step 5 of 20 (2 of 3 in the first 25%)" in found.message


def test_early_prunes_under_reach_are_a_note_on_its_verdicts_not_a_warning() -> None:
    """Under patience_mode=reach (the default) early prunes are out-of-reach verdicts made on
    the study's own curves: the README's example prunes 75 % at step 3 by design. The finding
    says so and names the one way to keep such trials, not 'raise patience'; under veto (or a
    run recorded before patience_mode existed), or reach below the default's patience or
    min_resource, it stays the warning."""
    reach = {"name": "patient_hyperband", "patience": 3, "patience_mode": "reach", "min_resource": 3}
    [found] = _aggressive_pruning(_pruned(steps={3: 26, 9: 4}, complete=10, pruned=30, rate=0.75),
                                  _facts(config={"pruner": reach}, max_complete_step=19))
    assert (found.code, found.severity) == ("aggressive_pruning", "info")
    assert found.message == ("75% of finished trials were pruned, half of them by step 3 of 19 "
                             "(26 of 30 in the first 25%)")
    assert found.advice.startswith("most were stopped as out of reach of the best value")
    assert "'pruner.patience_mode=veto' lets them run" in found.advice
    assert "raise pruner.patience" not in found.advice
    assert found.evidence["pruned_early"] == 26
    [found] = _aggressive_pruning(_pruned(steps={3: 26, 9: 4}, complete=10, pruned=30, rate=0.75),
                                  _facts(config={"pruner": {**reach, "min_resource": "auto"}},
                                         max_complete_step=19))
    assert found.severity == "info"
    # the incident's settings: Hyperband's own early verdicts are as likely as reach's
    for pruner in ({**reach, "patience_mode": "veto"}, {k: v for k, v in reach.items()
                                                         if k != "patience_mode"},
                   {"name": "hyperband", "patience_mode": "reach"}, {**reach, "patience": 2},
                   {**reach, "min_resource": 1}):
        [found] = _aggressive_pruning(_pruned(steps={3: 26, 9: 4}, complete=10, pruned=30, rate=0.75),
                                      _facts(config={"pruner": pruner}, max_complete_step=19))
        assert found.severity == "warning" and "raise pruner." in found.advice


@pytest.mark.parametrize(("report", "max_step"), [
    (_pruned(rate=0.59), 10),  # under AGGRESSIVE_PRUNE_RATE
    (_pruned(rate=None), 10),
    (_pruned(complete=0, pruned=2), 10),  # fewer than MIN_TRIALS finished
    (_pruned(steps={}), 10),  # a rate but no step recorded
    (_pruned(steps={3: 2}), 11),  # half pruned after the first quarter (2.75)
])
def test_pruning_late_or_of_few_trials_is_no_finding(report: StatusReport, max_step: int) -> None:
    assert _aggressive_pruning(report, _facts(max_complete_step=max_step)) == []


def test_failed_trials_count_as_finished() -> None:
    report = _pruned(complete=0, pruned=2, failed=1)
    assert [f.code for f in _aggressive_pruning(report, _facts(max_complete_step=10))] == \
        ["aggressive_pruning"]
    report = _report(prune_rate=0.6, prune_steps={2: 2},
                     states={"PRUNED": StateStats(count=2), "RUNNING": StateStats(count=5)})
    assert _aggressive_pruning(report, _facts(max_complete_step=10)) == []


# --- params_differ, stale_running, oom --------------------------------------------------------

def test_trials_that_ran_other_params_name_them_and_one_example() -> None:
    [found] = _params_differ(_facts(mismatches=[
        (4, {"max_bin": [255, 63], "lr": [0.1, 0.1]}), (6, {"device": ["gpu", "cpu"]})]))
    assert (found.code, found.severity) == ("params_differ", "warning")
    assert found.message == ("2 trials ran with parameters other than suggested (device, lr, "
                             "max_bin); e.g. trial #4: max_bin suggested 255, ran with 63")
    assert found.advice == ("the objective does not pass these to the library, or the library "
                            "overrides them: compare hpo.params_effective with the trial's params")
    assert found.evidence == {"trials": [4, 6], "params": ["device", "lr", "max_bin"]}
    assert _params_differ(_facts()) == []


def test_running_trials_without_a_heartbeat_are_stale() -> None:
    running = [{"number": 3, "stale": True, "heartbeat_age_s": 90.04, "grace_s": 60},
               {"number": 4, "stale": False, "heartbeat_age_s": 500.0, "grace_s": 60},
               {"number": 5, "stale": True, "heartbeat_age_s": 120.26, "grace_s": 60}]
    [found] = _stale_running(_report(running=running))
    assert (found.code, found.severity) == ("stale_running", "warning")
    assert found.message == ("2 trials are RUNNING without a heartbeat for up to 120 s (grace 60 s): "
                             "#3, #5")
    assert found.advice == ("their orchestrator is gone: any running orchestrator on this study "
                            "fails them as 'lost'; or run the same command again to resume")
    assert found.evidence == {"trials": [3, 5], "oldest_heartbeat_age_s": 120.3}
    assert _stale_running(_report(running=[running[1], {"number": 6}])) == []
    [found] = _stale_running(_report(running=[running[2]]))
    assert found.message == ("1 trial is RUNNING without a heartbeat for up to 120 s (grace 60 s): "
                             "#5")


def test_trials_out_of_memory_advise_fewer_per_gpu_naming_the_setting() -> None:
    [found] = _oom(_report(fail_reasons={"oom": 2, "exception": 5}),
                   {"scheduler": {"trials_per_gpu": 3}})
    assert (found.code, found.severity, found.message) == ("oom", "warning", "2 trials ran out of memory")
    assert found.advice == ("lower the batch size or the model size range, or run fewer trials per "
                            "GPU (scheduler.trials_per_gpu, now 3)")
    assert found.evidence == {"trials": 2}
    [one] = _oom(_report(fail_reasons={"oom": 1}), {})
    assert one.message == "1 trial ran out of memory"
    [found] = _oom(_report(fail_reasons={"oom": 1}), {})
    assert found.advice.endswith("run fewer trials per GPU (scheduler.trials_per_gpu)")
    assert _oom(_report(fail_reasons={"exception": 5}), {}) == []


# --- shared_cores (from a study: test_findings_shared_cores.py) -------------------------------

def _shared(host: str, cores: int, others: int) -> dict[str, Any]:
    return {"host": host, "since": "s", "until": "u", "cores": cores, "wanted": 1,
            "others": [{"pid": p, "user": "ann", "study": "b", "cores": 1} for p in range(others)]}


def test_the_advice_splits_the_fewest_cores_any_host_has_per_run() -> None:
    """scheduler.host_cores for each run: the cores over the runs (theirs and this one), on the
    host where that is least; one core: taskset alone."""
    [found] = _shared_cores(_facts(shared_cores=[_shared("a", 8, 1), _shared("b", 6, 2)]))
    assert (found.code, found.severity) == ("shared_cores", "warning")
    assert found.advice == ("give each run its own cores (scheduler.host_cores=2 in each, or "
                            "taskset -c), or run the studies one after the other")
    assert found.message == (
        "host a, from s to u: another hpo-orchestrator run (pid 0, ann, study 'b') used 1 of the 8 "
        "cores the study's trials ran on, beside the 1 they used; host b, from s to u: 2 other "
        "hpo-orchestrator runs (pid 0, ann, study 'b': 1; pid 1, ann, study 'b': 1) used 2 of the 6 "
        "cores the study's trials ran on, beside the 1 they used: trials shared cores and ran slower")
    [found] = _shared_cores(_facts(shared_cores=[{**_shared("a", 1, 1), "until": None}]))
    assert found.message.startswith("host a, from s on (its end not recorded): another "
                                    "hpo-orchestrator run (pid 0, ann, study 'b') used 1 of the 1 "
                                    "core the study's")
    assert "(taskset -c)" in found.advice
    [found] = _shared_cores(_facts(shared_cores=[_shared("a", 2, 1)]))
    assert "(scheduler.host_cores=1 in each, or taskset -c)" in found.advice
    assert _shared_cores(_facts()) == []


# --- all of them ------------------------------------------------------------------------------

def test_a_study_with_every_problem_gets_every_finding() -> None:
    report = _pruned(steps={1: 2})
    report.per_device = [_gpu()]
    report.running = [{"number": 3, "stale": True, "heartbeat_age_s": 90.0, "grace_s": 60}]
    report.fail_reasons = {"oom": 1}
    report.per_device[0].util_compute_mean = 10.0
    facts = _facts(failures=[(1, "exception", "x")], unverified=[(2, None)],
                   startup=(3, 5.0, 6.0), mismatches=[(4, {"a": [1, 2]})],
                   shared_cores=[_shared("a", 8, 1)], max_complete_step=10)
    found = find_all(report, facts)
    assert all(isinstance(f, Finding) for f in found)
    assert sorted(f.code for f in found) == sorted([
        "failing_trials", "idle_gpu", "low_gpu_util", "gpu_unused", "slow_startup",
        "aggressive_pruning", "params_differ", "stale_running", "oom", "shared_cores"])
