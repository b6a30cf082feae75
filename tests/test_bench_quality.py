"""The time-to-quality benchmark's arithmetic (scripts/benchmarking/quality.py):
exact small cases, censoring, ties and known-answer bootstraps. No study runs here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scripts.benchmarking.quality import (
    Censored,
    best_so_far,
    median_time,
    paired_speedup,
    quartile_band,
    targets_from_curve,
    time_to_target,
    value_at,
)

CURVE = [(5.0, 0.50), (1.0, 0.60), (9.0, 0.45), (3.0, 0.70), (7.0, 0.48)]


def test_best_so_far_keeps_the_improvements_in_time_order() -> None:
    assert best_so_far(CURVE) == [(1.0, 0.60), (5.0, 0.50), (7.0, 0.48), (9.0, 0.45)]
    assert best_so_far([(2.0, 0.5), (2.0, 0.4)]) == [(2.0, 0.4)]  # a tie in time: the best
    assert best_so_far([]) == []


def test_value_at_is_a_step_function_inf_before_the_first_trial() -> None:
    assert value_at(CURVE, 0.5) == math.inf
    assert value_at(CURVE, 1.0) == 0.60  # completed at t counts at t
    assert value_at(CURVE, 6.9) == 0.50
    assert value_at(CURVE, 100.0) == 0.45


def test_targets_are_the_reference_values_at_10_50_100_percent_of_its_budget() -> None:
    assert targets_from_curve(CURVE, 10.0) == {"10%": 0.60, "50%": 0.50, "100%": 0.45}
    assert targets_from_curve(CURVE, 8.0) == {"10%": math.inf, "50%": 0.60, "100%": 0.48}


def test_time_to_target_with_ties_and_censoring() -> None:
    assert time_to_target(CURVE, 0.50, 10.0) == Censored(5.0, False)  # equal to the target: reached
    assert time_to_target(CURVE, 0.49, 10.0) == Censored(7.0, False)
    assert time_to_target(CURVE, 0.40, 10.0) == Censored(10.0, True)  # never: the budget, censored
    assert time_to_target(CURVE, 0.45, 8.0) == Censored(8.0, True)  # reached after the budget


def test_speedup_exact_small_case_and_the_censoring_counts() -> None:
    ours = [Censored(2.0, False), Censored(10.0, True), Censored(5.0, False), Censored(10.0, True)]
    base = [Censored(4.0, False), Censored(5.0, False), Censored(10.0, True), Censored(10.0, True)]
    ci = paired_speedup(ours, base, resamples=200)
    # ratios 2.0, 0.5 (upper bound), 2.0 (lower bound), 1.0 (both censored): median 1.5
    assert ci.median == pytest.approx(1.5)
    assert (ci.pairs, ci.ours_censored, ci.baseline_censored, ci.both_censored) == (4, 1, 1, 1)
    assert ci.low <= ci.median <= ci.high


def test_identical_contenders_give_an_interval_that_contains_one() -> None:
    rng = np.random.default_rng(1)
    times = [Censored(float(t), False) for t in rng.uniform(10, 60, size=10)]
    ci = paired_speedup(times, times)
    assert ci.median == 1.0 and ci.low <= 1.0 <= ci.high and not ci.excludes_one


def test_noisy_equal_contenders_rarely_exclude_one() -> None:
    rng = np.random.default_rng(2)
    ours = [Censored(float(t), False) for t in rng.lognormal(3.0, 0.5, size=10)]
    base = [Censored(float(t), False) for t in rng.lognormal(3.0, 0.5, size=10)]
    assert paired_speedup(ours, base).low <= 1.0 <= paired_speedup(ours, base).high


def test_twice_as_fast_excludes_one_with_ten_seeds_and_not_with_two_noisy_ones() -> None:
    rng = np.random.default_rng(3)
    base_t = rng.lognormal(3.0, 0.3, size=10)
    noise = rng.lognormal(0.0, 0.2, size=10)
    ours = [Censored(float(t), False) for t in base_t / 2.0 * noise]
    base = [Censored(float(t), False) for t in base_t]
    ci = paired_speedup(ours, base)
    assert ci.excludes_one and ci.low > 1.0 and 1.5 < ci.median < 2.7
    # two seeds, one each way: the interval is the range of the two ratios and contains 1
    few = paired_speedup([Censored(10.0, False), Censored(40.0, False)],
                         [Censored(20.0, False), Censored(20.0, False)])
    assert few.low == pytest.approx(0.5) and few.high == pytest.approx(2.0)


def test_the_bootstrap_is_repeatable_and_rejects_unpaired_input() -> None:
    ours = [Censored(float(t), False) for t in (3, 5, 8, 13)]
    base = [Censored(float(t), False) for t in (4, 9, 8, 20)]
    assert paired_speedup(ours, base) == paired_speedup(ours, base)
    with pytest.raises(ValueError):
        paired_speedup(ours, base[:3])
    with pytest.raises(ValueError):
        paired_speedup([], [])


def test_median_time_is_a_lower_bound_once_half_the_runs_are_censored() -> None:
    assert median_time([Censored(3.0, False), Censored(5.0, False), Censored(9.0, True)]) == (5.0, False)
    assert median_time([Censored(3.0, False), Censored(9.0, True)]) == (6.0, True)
    assert median_time([Censored(9.0, True), Censored(9.0, True), Censored(2.0, False)]) == (9.0, True)


def test_quartile_band_counts_missing_runs_as_worse_and_leaves_gaps() -> None:
    runs = [[(1.0, 0.5), (3.0, 0.3)], [(2.0, 0.6)], [(4.0, 0.4)], [(1.0, 0.7)]]
    band = quartile_band(runs, [0.5, 1.0, 2.0, 5.0])
    assert np.isnan(band[:, 0]).all()  # no run has a trial yet
    # t=1: values 0.5, inf, inf, 0.7 -> q25 between 0.5 and 0.7; median and q75 need a missing run
    assert band[0, 1] == pytest.approx(0.65) and np.isnan(band[1, 1]) and np.isnan(band[2, 1])
    # t=5: 0.3, 0.6, 0.4, 0.7: linear quantiles
    assert list(band[:, 3]) == pytest.approx([0.375, 0.5, 0.625])
    assert np.isnan(quartile_band([], [1.0])).all()


# --- the launcher's plans and the results folder (scripts/bench_quality.py, tables.py) -----

def _script() -> Any:
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_quality.py"
    spec = importlib.util.spec_from_file_location("bench_quality", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_optuna_processes_get_a_gpu_each_and_disjoint_cores(tmp_path: object) -> None:
    from pathlib import Path

    bq = _script()
    work = bq.WORKLOADS["a"]
    half = bq.Half([2, 3], list(range(8)), "second half")
    plan = bq.launches("optuna-median", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert [p.gpus for p in plan] == [[2], [3]]
    assert [p.cores for p in plan] == [[0, 1, 2, 3], [4, 5, 6, 7]] and {p.threads for p in plan} == {4}
    assert all({"--pruner", "median", "--device", "gpu", "--seed", "7"} <= set(p.argv) for p in plan)
    cpu = bq.launches("optuna-cpu-t2", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert len(cpu) == 4 and all(p.gpus == [] and "cpu" in p.argv for p in cpu)
    assert sorted(c for p in cpu for c in p.cores) == list(range(8))
    ours = bq.launches("ours-median", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert len(ours) == 1 and ours[0].gpus == [2, 3] and ours[0].threads is None
    assert {"sampler.seed=7", "pruner=median"} <= set(ours[0].argv)
    # its defaults: every GPU of the half once (scheduler.parallel unset)
    assert not any(a.startswith("scheduler.parallel") for a in ours[0].argv)
    on_cpu = bq.launches("ours-cpu", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert [a for a in on_cpu[0].argv if a.startswith("objective.device")] == ["objective.device=cpu"]
    threads = bq.launches("optuna-threads", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert len(threads) == 1 and "--n-jobs" in threads[0].argv
    assert bq.parse_seeds("1-3,7") == [1, 2, 3, 7]
    assert bq.known("optuna-cpu-t16") and not bq.known("optuna-cpu-tx")
    cuda = bq.launches("optuna-nopruner", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"),
                       "cuda")
    assert all(p.argv[p.argv.index("--device") + 1] == "cuda" for p in cuda)
    mv = bq.launches("ours-mvtpe", work, 1.0, 7, 60.0, half, "sqlite:///x.db", Path("/tmp"))
    assert {"sampler.multivariate=true", "sampler.constant_liar=true"} <= set(mv[0].argv)


def test_the_best_trial_is_retrained_on_the_learner_it_used() -> None:
    bq = _script()
    cpu = ({"device_type": "cpu"}, None)
    cuda = ({"device_type": "cuda", "gpu_device_id": 0}, 2)  # the child sees the run's GPU 2 alone
    ours = {"contender": "ours", "gpus": [2, 3], "gpu_learner": "cuda"}
    effective = {"hpo.params_effective": {"device_type": "cuda", "num_leaves": 31}}
    assert bq.retrain_device(ours, effective) == cuda
    # ours' auto chose the CPU or OpenCL for that trial; or the trial recorded nothing
    for learner in ("cpu", "gpu"):
        assert bq.retrain_device(ours, {"hpo.params_effective": {"device_type": learner}}) == cpu
    assert bq.retrain_device(ours, {}) == cpu
    def optuna(name: str, gpus: list[int], learner: str = "cuda") -> dict[str, Any]:
        plan = bq.launches(name, bq.WORKLOADS["b"], 1.0, 7, 60.0, bq.Half(gpus, list(range(8)), "h"),
                           "sqlite:///x.db", Path("/tmp"), learner)
        return {"contender": name, "gpus": gpus, "gpu_learner": learner,
                "commands": [" ".join(one.argv[1:]) for one in plan]}

    assert bq.retrain_device(optuna("optuna-nopruner", [2, 3]), {}) == cuda
    # OpenCL, Optuna's CPU processes and a half without GPUs retrain on the CPU
    assert bq.retrain_device(optuna("optuna-nopruner", [2, 3], "gpu"), {}) == cpu
    assert bq.retrain_device(optuna("optuna-cpu-t8", [2, 3]), {}) == cpu
    assert bq.retrain_device(optuna("optuna-nopruner", []), {}) == cpu


def test_the_retraining_child_sees_only_the_runs_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    bq = _script()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)  # restored after the test
    bq._show_only(None)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    bq._show_only(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_optuna_workers_know_which_workloads_train_lightgbm() -> None:
    from scripts.benchmarking.optuna_worker import LIGHTGBM_WORKLOADS
    from scripts.benchmarking.workloads import WORKLOADS

    assert set(LIGHTGBM_WORKLOADS) == {n for n, w in WORKLOADS.items() if w.kind == "lightgbm"}


def test_store_replaces_a_rerun_seed_picks_the_best_baseline_and_writes_tables(
        tmp_path: object) -> None:
    from pathlib import Path

    from scripts.benchmarking.tables import Store

    out = Path(str(tmp_path))
    store = Store(out)
    meta = {"command": "c", "commit": "x", "machine": "m", "gpu_util_mean": 0.0, "pruned": 0,
            "test": None, "budget_s": 10.0}

    def run(name: str, seed: int, curve: list[tuple[float, float]], group: str = "solo") -> dict:
        return {**meta, "workload": "a", "group": group, "contender": name, "seed": seed,
                "curve": curve, "complete": len(curve), "best_value": min(v for _, v in curve)}

    store.add(run("optuna-x", 1, [(0.5, 0.9), (4.0, 0.5), (9.0, 0.4)], "reference"))
    store.add(run("optuna-y", 1, [(0.5, 0.8), (9.0, 0.45)], "reference"))
    entry = store.update_targets("a")
    assert entry["contender"] == "optuna-x" and entry["targets"] == {"10%": 0.9, "50%": 0.5, "100%": 0.4}
    store.add(run("ours", 1, [(1.0, 0.3)]))
    store.add(run("ours", 1, [(2.0, 0.5)]))  # the same seed again: replaces
    store.add(run("optuna-x", 1, [(4.0, 0.5)]))
    assert len([r for r in Store(out).runs if r["contender"] == "ours"]) == 1
    store.write_report()
    text = (out / "results.md").read_text()
    assert "| ours | 1 | 1 (0) | 0.50000 |" in text
    assert ">=10.0 (1 cens.)" in text  # neither reached 0.4: censored at the budget
    assert "| ours | optuna-x | 2.00 [2.00, 2.00], n=1; 0/0/0 |" in text
    assert (out / "curves-a-solo.png").exists()
    # an ablation pair (two of ours, no Optuna baseline): the variant against plain `ours`
    store.add(run("ours", 2, [(2.0, 0.5)], "pair:ours-median+ours"))
    store.add(run("ours-median", 2, [(1.0, 0.5)], "pair:ours-median+ours"))
    store.write_report()
    text = (out / "results.md").read_text()
    assert "| ours-median | ours | 2.00 [2.00, 2.00], n=1; 0/0/0 |" in text


def test_concurrent_seeds_get_disjoint_core_blocks_and_pairs_swap_halves() -> None:
    bq = _script()
    assert bq.seed_batches(["a", "b"], "a,b", 2) == [[("a", "first"), ("b", "second")]]
    assert bq.seed_batches(["a", "b"], "a,b", 3) == [[("a", "second"), ("b", "first")]]
    # alone: one after the other, the first place rotating with the seed (a cold host's first
    # run pays for the page cache)
    assert bq.seed_batches(["a", "b"], None, 2) == [[("a", "all")], [("b", "all")]]
    assert bq.seed_batches(["a", "b"], None, 1) == [[("b", "all")], [("a", "all")]]
    assert bq.seed_batches(["a", "b", "c"], None, 4) == [[("b", "all")], [("c", "all")],
                                                         [("a", "all")]]
    first, second = bq.half("first", [], [8, 9, 10, 11]), bq.half("second", [], [8, 9, 10, 11])
    assert (first.cores, second.cores, first.gpus) == ([8, 9], [10, 11], [])
    assert bq.half("second", [0, 1, 2, 3], [0, 1]).gpus == [2, 3]


_THREADS_RUN = """
import optuna
from scripts.benchmarking.workloads import WORKLOADS, lightgbm_objective
optuna.logging.set_verbosity(optuna.logging.WARNING)
cfg = WORKLOADS["a"].scaled(0.5).lightgbm
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0),
                            pruner=optuna.pruners.NopPruner())
study.optimize(lightgbm_objective(cfg, {"device_type": "cpu"}, 1), n_trials=12, n_jobs=4)
print(sorted({t.state.name for t in study.trials}))
"""


def test_optuna_threads_share_the_kept_cpu_datasets_without_a_crash() -> None:
    """optuna-threads runs trials in threads of one process: the Datasets every trial reuses
    are binned before the first one, not by whichever thread trains first (it crashed)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _THREADS_RUN], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['COMPLETE']"


@pytest.mark.parametrize(("device", "threaded", "kept"), [
    ("cpu", False, True), ("cpu", True, True), ("cuda", False, True),
    ("cuda", True, False), ("gpu", False, False)])
def test_optuna_processes_keep_the_datasets_ours_keep(device: str, threaded: bool, kept: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna's processes bin once where ours do (CPU and CUDA learners: objectives/lightgbm.py),
    so a comparison is not won by binning; threads of one process share the CPU's only."""
    from scripts.benchmarking import workloads

    built: list[object] = []
    monkeypatch.setattr(workloads, "_datasets",
                        lambda cfg, kept_for=None: built.append(kept_for) or ("train", "valid"))
    workloads.lightgbm_objective(workloads.WORKLOADS["a"].lightgbm, {"device_type": device}, 2,
                                 threaded=threaded)
    assert (len(built) == 1 and built[0]["device_type"] == device) is kept  # type: ignore[index]
    assert len(built) == (1 if kept else 0)
