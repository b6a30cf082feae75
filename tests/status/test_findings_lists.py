"""The trials a finding names (status/_findings.py, ``gpu_unused`` and ``stale_running``):
at most eight, by number, then how many more; written for the mutants mutmut found
unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hpo_orchestrator.status._findings import (
    IDLE_BUSY_BELOW,
    IDLE_GAP_FLOOR_S,
    IDLE_MIN_EMPTY_S,
    _core_user,
    _few,
    _gentler,
    _idle_advice,
    _idle_share,
    _startup_advice,
)


@pytest.mark.parametrize(("count", "said"), [
    (0, ""),
    (1, "#0"),
    (8, "#0, #1, #2, #3, #4, #5, #6, #7"),
    (9, "#0, #1, #2, #3, #4, #5, #6, #7 and 1 more"),
    (12, "#0, #1, #2, #3, #4, #5, #6, #7 and 4 more"),
])
def test_a_finding_names_eight_trials_then_how_many_more(count: int, said: str) -> None:
    assert _few(list(range(count))) == said


@pytest.mark.parametrize(("parallel", "advice"), [
    (2, "scheduler.parallel=2 runs fewer trials than this host has GPUs (4): set "
        "scheduler.parallel=4 or more"),
    (4, "slots stayed empty between trials: look at startup time (hpo.startup_s), trials "
        "failing at once, or another process holding the GPU"),  # as many as GPUs: not too few
    ("auto", "slots stayed empty between trials: look at startup time (hpo.startup_s), trials "
             "failing at once, or another process holding the GPU"),
])
def test_idle_gpus_advice_names_too_few_parallel_trials_only(parallel: object, advice: str) -> None:
    """_idle_advice: "only a fixed number can be too few": fewer than the host's GPUs."""
    assert _idle_advice(parallel, 4) == advice


@pytest.mark.parametrize(("pruner", "advice"), [
    ({"name": "median", "n_warmup_steps": 3}, "raise pruner.n_warmup_steps (now n_warmup_steps=3)"),
    ({"name": "median"}, "raise pruner.n_warmup_steps"),  # a config without it: no "(now )"
    ({"name": "none"}, "pruner=none: the objective stops these trials itself (it raises "
                       "optuna.TrialPruned); let it wait longer, or give the study a pruner"),
    ({"name": "hyperband", "min_resource": 1},
     "raise pruner.min_resource (now min_resource=1), or use pruner=patient_hyperband "
     "(Hyperband's verdict waits for pruner.patience steps without improvement; only trials out "
     "of reach of the best value are stopped sooner)"),
    ({"name": "patient_hyperband", "patience": 3, "min_resource": 3},
     "raise pruner.patience and pruner.min_resource (now patience=3, min_resource=3)"),
])
def test_the_keys_that_make_each_pruner_wait_longer(pruner: dict[str, object], advice: str) -> None:
    """_gentler: each pruner's own keys, with their values now where the study recorded them."""
    assert _gentler(pruner) == advice


@pytest.mark.parametrize(("mode", "advice"), [
    ("fresh", "each start buys little training before the pruner decides: set "
              "scheduler.worker_mode=reuse (now fresh): imports and set-up once per slot"),
    ("reuse", "each start buys little training before the pruner decides: make the objective's "
              "own start faster (data loading, model building)"),  # made already: not advised
])
def test_the_start_up_advice_gives_only_the_changes_not_made(mode: str, advice: str) -> None:
    assert _startup_advice({"scheduler": {"worker_mode": mode}}) == advice


@pytest.mark.parametrize(("config", "step"), [
    ({"pruner": {"name": "patient_hyperband", "min_resource": "auto"}},
     "lower pruner.startup_share (min_resource=auto then waits longer before the first pruning "
     "decision)"),
    ({"pruner": {"name": "hyperband", "min_resource": 2}}, "raise pruner.min_resource (now 2)"),
    ({"objective": {"name": "custom"}}, "load the data once per worker in objective.setup"),
    ({"pruner": {"name": "patient_hyperband", "min_resource": 2}, "scheduler": {"worker_mode": "fresh"}},
     "raise pruner.min_resource (now 2) or set pruner.min_resource=auto; set "
     "scheduler.worker_mode=reuse (now fresh): imports and set-up once per slot"),
    ({"objective": {"name": "custom", "setup": "mod:load"}},
     "make the objective's own start faster (data loading, model building)"),  # has a setup
])
def test_the_start_up_advice_by_pruner_and_objective(config: dict[str, object], step: str) -> None:
    assert _startup_advice(config) == (
        "each start buys little training before the pruner decides: " + step)


def _use(busy: float | None = 0.5, queued: float | None = 0.25, waited: float = 10.0,
         trials: int = 4) -> SimpleNamespace:
    """One GPU's row of the per-device table, as _idle_share reads it."""
    return SimpleNamespace(busy_fraction=busy, busy_fraction_queued=queued,
                           active_queued_s=waited, host="h", gpu_index=0, trials=trials)


def _facts(others_s: float = 2.5) -> SimpleNamespace:
    return SimpleNamespace(other_studies_s={("h", 0): others_s})


@pytest.mark.parametrize(("use", "others_s", "share"), [
    # busy 25 % of the 10 s trials waited, other studies 25 %: 5 s empty, 1 s per gap (4 trials)
    (_use(), 2.5, 0.25),
    (_use(trials=5), 2.5, None),  # under a second a gap: the orchestrator's own latency
    (_use(queued=0.3), 2.5, None),  # 4.5 s empty in all: too short
    (_use(busy=0.75), 2.5, None),  # busy enough overall (the bound is busy)
    (_use(queued=0.75, waited=100.0), 0.0, None),  # busy enough while trials waited
    (_use(busy=0.9, queued=0.25, waited=100.0), 0.0, None),
    (_use(queued=0.5, waited=100.0), 25.0, None),  # with the other studies': 75 %, busy enough
    (_use(waited=0.0), 0.0, None),  # no trial waited: nothing to judge
    (_use(busy=None), 0.0, None),
    (_use(queued=None), 0.0, None),
])
def test_an_idle_gpu_at_the_edges_of_its_bounds(use: SimpleNamespace, others_s: float,
                                                share: float | None) -> None:
    """_idle_share: idle where busy under IDLE_BUSY_BELOW overall and while trials waited (other
    studies' trials counted busy), empty at least IDLE_MIN_EMPTY_S in all and IDLE_GAP_FLOOR_S
    per trial; the share other studies kept it busy, else None."""
    assert (IDLE_BUSY_BELOW, IDLE_MIN_EMPTY_S, IDLE_GAP_FLOOR_S) == (0.75, 5.0, 1.0)
    assert _idle_share(use, _facts(others_s)) == share  # type: ignore[arg-type]


def test_another_run_on_the_cores_is_named_by_pid_user_and_study() -> None:
    """shared_cores names the other run; its lease may not say whose it is."""
    assert _core_user({"pid": 7, "user": "ann", "study": "cnn"}) == "pid 7, ann, study 'cnn'"
    assert _core_user({"pid": 7, "study": "cnn"}) == "pid 7, an unknown user, study 'cnn'"


def test_an_idle_gpu_is_a_warning_naming_its_device(tmp_path: Path) -> None:
    """The finding's evidence names the idle devices ("device", as every finding that has
    one) and it is a warning: status and report sort and colour findings by severity."""
    from tests.status.test_findings_idle_gpu import _back_to_back, _idle, _status, _write

    url = f"sqlite:///{tmp_path / 'i.db'}"
    _write(url, "i", _back_to_back(0, 0, 10, 100), gpus=2)
    [idle] = _idle(_status(url, "i"))
    assert (idle.severity, idle.evidence["device"]) == ("warning", "gpu1")
