"""objective.device=auto for LightGBM: the rule on scripted timings, and a real run on fake GPUs
(issue 27.2; objectives/_device.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpo_orchestrator.objectives import _device
from hpo_orchestrator.objectives._device import GPU_MARGIN, LEAVES_FACTOR, Calibration, Timing, pick, picture
from tests.conftest import run_cli, trial_rows


def _t(learner: str, per_round: float | None, overhead: float = 0.1,
       error: str | None = None) -> Timing:
    return Timing(learner, per_round, None if per_round is None else overhead, error)


def test_the_cpu_wins_where_it_trains_faster() -> None:
    learner, why = pick([_t("cpu", 0.004), _t("cuda", 0.015, 1.0)], rounds=200, cpu_threads=16)
    assert learner == "cpu"
    assert why == "CPU (16 threads) 0.90 s per trial against cuda 4.00 s"


def test_a_gpu_learner_wins_by_its_margin_only() -> None:
    cpu = _t("cpu", 0.06)  # 12.1 s for 200 rounds
    clear = _t("cuda", 0.025, 0.5)  # 5.5 s
    assert pick([cpu, clear], 200, 16)[0] == "cuda"
    close = _t("cuda", 12.1 / GPU_MARGIN / 200 + 0.001, 0.0)  # just under the margin
    assert pick([cpu, close], 200, 16)[0] == "cpu"


def test_the_fastest_gpu_learner_is_the_one_weighed() -> None:
    timings = [_t("cpu", 0.06), _t("gpu", 0.05, 3.0), _t("cuda", 0.02, 0.5)]
    assert pick(timings, 200, 16) == ("cuda", "cuda 4.50 s per trial against CPU (16 threads) 12.10 s")
    # with few rounds OpenCL's overhead shows: CUDA wins there too
    assert pick([_t("cpu", 0.06), _t("gpu", 0.05, 3.0)], 20, 16)[0] == "cpu"


def test_no_gpu_learner_that_runs_means_the_cpu_with_the_reasons() -> None:
    timings = [_t("cpu", 0.01), _t("cuda", None, error="LightGBMError: no CUDA"),
               _t("gpu", None, error="LightGBMError: No OpenCL device found")]
    learner, why = pick(timings, 100, 2)
    assert learner == "cpu"
    assert "cuda: LightGBMError: no CUDA" in why and "gpu: LightGBMError: No OpenCL" in why


def test_the_picture_changes_with_data_bins_threads_and_leaves_a_factor_away() -> None:
    base = {"max_bin": 63, "num_leaves": 40, "num_threads": 8}
    assert picture("d", base).near(picture("d", {**base, "num_leaves": LEAVES_FACTOR * 40 - 1}))
    assert picture("d", base).near(picture("d", {**base, "num_leaves": 11}))
    for other in ({**base, "num_leaves": LEAVES_FACTOR * 40}, {**base, "num_leaves": 10},
                  {**base, "max_bin": 255}, {**base, "num_threads": 4}):
        assert not picture("d", other).near(picture("d", base))
    assert not picture("e", base).near(picture("d", base))


def test_calibration_measures_once_per_picture_and_again_when_it_changes() -> None:
    runs: list[tuple[str, int]] = []

    def train(params: dict[str, Any], rounds: int, tick: Any) -> None:
        runs.append((params["device_type"], rounds))
        for _ in range(rounds):
            tick(None)

    learners = {"cpu": {"device_type": "cpu"}, "cuda": {"device_type": "cuda"}}
    calibration = Calibration()
    first, measured = calibration.choose(picture("a", {"num_leaves": 31}), learners, {}, train,
                                         200, 4)
    assert measured and runs == [("cpu", 20), ("cuda", 20), ("cuda", 20)]  # a GPU's twice
    assert first["measured_num_leaves"] == 31
    for leaves in (31, 100, 9):  # near the measured 31: the answer holds
        again, measured_again = calibration.choose(picture("a", {"num_leaves": leaves}),
                                                   learners, {}, train, 200, 4)
        assert again == first and not measured_again and len(runs) == 3
    _, measured_new = calibration.choose(picture("b", {"num_leaves": 31}), learners, {}, train,
                                         200, 4)
    assert measured_new and len(runs) == 6
    big, measured_big = calibration.choose(picture("a", {"num_leaves": 200}), learners, {},
                                           train, 200, 4)
    assert measured_big and big["measured_num_leaves"] == 200 and len(runs) == 9
    # 100 lies between 31 and 200, near both: interpolated from the two, nothing measured
    between, measured_between = calibration.choose(picture("a", {"num_leaves": 100}), learners,
                                                   {}, train, 200, 4)
    assert not measured_between and len(runs) == 9
    assert between["measured_num_leaves"] == [31, 200]
    # 300 is near 200 only: its answer
    assert calibration.choose(picture("a", {"num_leaves": 300}), learners, {}, train, 200, 4)[0] is big
    # no num_leaves (LightGBM's 31) or a tree of 1: still a picture
    assert picture("a", {}).leaves == 31 and picture("a", {"num_leaves": 1}).leaves == 2
    assert {t["learner"] for t in first["timings"]} == {"cpu", "cuda"}


def test_prepare_runs_untimed_before_a_measurement_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU learner's Datasets are binned before the timing (later CPU trials reuse them,
    GPU ones pay their own binning each trial): a slow prepare must not make the CPU lose."""
    clock = [0.0]  # a scripted clock: seconds pass only where this test says
    monkeypatch.setattr(_device.time, "perf_counter", lambda: clock[0])
    events: list[str] = []

    def train(params: dict[str, Any], rounds: int, tick: Any) -> None:
        events.append(params["device_type"])
        for _ in range(rounds):
            clock[0] += 0.01 if params["device_type"] == "cpu" else 0.03
            tick(None)

    def prepare() -> None:
        events.append("prepare")
        clock[0] += 100.0  # far more than either learner's whole training

    learners = {"cpu": {"device_type": "cpu"}, "cuda": {"device_type": "cuda"}}
    calibration = Calibration()
    answer, _ = calibration.choose(picture("a", {}), learners, {}, train, 200, 4, prepare=prepare)
    assert events == ["prepare", "cpu", "cuda", "cuda"] and answer["learner"] == "cpu"
    assert answer["timings"][0]["overhead_s"] < 1.0
    calibration.choose(picture("a", {}), learners, {}, train, 200, 4, prepare=prepare)
    assert events == ["prepare", "cpu", "cuda", "cuda"]  # the answer held: nothing measured


@pytest.mark.parametrize("gpu_learner", ["gpu", "cuda"])
def test_a_gpu_learner_runs_twice_and_its_first_run_costs_are_left_out(
        gpu_learner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process's first training on a GPU learner pays once what its trials will not
    (OpenCL's kernel build; CUDA's kernels and allocations): timed once, the GPU would lose a
    race it wins. Here its first run spends 5 s before its rounds, the second 0.1 s; rounds
    take 0.01 s on the GPU and 0.03 s on the CPU (6.1 s a trial against 4.1 s: the GPU)."""
    clock = [0.0]
    monkeypatch.setattr(_device.time, "perf_counter", lambda: clock[0])
    runs: list[str] = []

    def train(params: dict[str, Any], rounds: int, tick: Any) -> None:
        on_gpu = params["device_type"] != "cpu"
        runs.append(params["device_type"])
        clock[0] += (5.0 if runs.count(gpu_learner) == 1 else 0.1) if on_gpu else 0.1
        for _ in range(rounds):
            clock[0] += 0.01 if on_gpu else 0.03
            tick(None)

    learners = {"cpu": {"device_type": "cpu"}, gpu_learner: {"device_type": gpu_learner}}
    answer, _ = Calibration().choose(picture("a", {}), learners, {}, train, 200, 4)
    assert runs == ["cpu", gpu_learner, gpu_learner]
    assert answer["learner"] == gpu_learner
    assert answer["timings"][1]["overhead_s"] == pytest.approx(0.1)
    # the faster run counts whichever it is: a second run slowed by another process's burst
    overheads = iter([0.2, 3.0])

    def burst_second(params: dict[str, Any], rounds: int, tick: Any) -> None:
        clock[0] += next(overheads)
        for _ in range(rounds):
            clock[0] += 0.01
            tick(None)

    timing = _device._train_timing("cuda", burst_second, {}, 20)
    assert timing.estimate_s(200) == pytest.approx(0.2 + 200 * 0.01)


def test_with_the_cuda_learner_opencl_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenCL was the slower GPU learner in every measurement, and its kernel build costs
    seconds per calibration: beside CUDA it is left out; without CUDA it is the GPU learner."""
    from types import SimpleNamespace

    import hpo_orchestrator.objectives.lightgbm as lgb_objective
    from hpo_orchestrator.config import LightGBMObjectiveConfig
    from hpo_orchestrator.gpu._opencl import OpenCLPlatform

    nvidia = OpenCLPlatform(1, "NVIDIA CUDA", "NVIDIA Corporation", 1, 1)
    monkeypatch.setattr(lgb_objective, "list_platforms", lambda: [nvidia])
    slot = SimpleNamespace(on_gpu=True)
    trial = SimpleNamespace(set_user_attr=lambda *_: None)
    for cuda, platform, expected in (((True, None), "auto", {"cuda"}),
                                     ((False, "no CUDA"), "auto", {"gpu"}),
                                     ((True, None), 1, {"cuda", "gpu"})):  # a platform named
        monkeypatch.setattr(lgb_objective, "cuda_learner_available", lambda c=cuda: c)
        objective = lgb_objective.LightGBMObjective(
            LightGBMObjectiveConfig(n_rows=200, gpu_platform=platform))
        learners = objective._gpu_learners(trial, slot)
        assert set(learners) == expected
        assert learners.get("gpu", {"gpu_platform_id": 1})["gpu_platform_id"] == 1


@pytest.mark.slow
def test_auto_on_a_gpu_slot_records_its_measured_choice(tmp_path: Path) -> None:
    """On fake GPUs this host has neither LightGBM's CUDA learner nor an OpenCL GPU: the
    worker's first trial trains at once on the likely learner (the CPU, for 2,000 rows), the
    next measures, trains on the CPU, says why, and no trial is flagged as a GPU unused."""
    result = run_cli(tmp_path, "run", "study.n_trials=3", "objective.n_rows=2000",
                     "objective.num_boost_round=20", "objective.report_every=5",
                     "scheduler.parallel=1", env={"HPO_ORCHESTRATOR_FAKE_GPUS": "1"})
    assert result.code == 0, result.stderr
    rows = sorted(trial_rows(result.db), key=lambda r: r["number"])
    choices = [r["attrs"]["hpo.device_choice"] for r in rows]
    assert [c["learner"] for c in choices] == ["cpu"] * 3
    assert choices[0]["guessed"] and not choices[0]["measured_here"]
    assert choices[0]["reason"].startswith("not measured yet: 2,000 rows x 40 features")
    assert choices[1]["measured_here"]  # later trials measure again only for a new picture
    assert "no GPU learner ran" in choices[1]["reason"]
    assert all(r["attrs"]["hpo.params_effective"]["device_type"] == "cpu" for r in rows)
    assert all(r["attrs"].get("hpo.gpu_verified") is None for r in rows)
    assert "gpu_unused" not in result.stdout
    # the study attr status and report read: the latest measurement, said in a line
    status = run_cli(tmp_path, "status", "--json")
    [entry] = json.loads(status.stdout)["device_choices"]
    latest = max(r["number"] for r in rows if r["attrs"]["hpo.device_choice"]["measured_here"])
    assert entry["learner"] == "cpu" and entry["trial"] == latest and entry["gpu"] == 0
    assert entry["learners"] == {"0": {"cpu": 3}}  # every trial counted, written at the end
    resumed = run_cli(tmp_path, "run", "study.n_trials=5", "objective.n_rows=2000",
                      "objective.num_boost_round=20", "objective.report_every=5",
                      "scheduler.parallel=1", env={"HPO_ORCHESTRATOR_FAKE_GPUS": "1"})
    assert resumed.code == 0, resumed.stderr
    [entry] = json.loads(run_cli(tmp_path, "status", "--json").stdout)["device_choices"]
    assert entry["learners"] == {"0": {"cpu": 5}}  # the earlier run's trials still counted
    text = run_cli(tmp_path, "status").stdout
    assert "objective.device=auto on " in text and "chose the CPU: no GPU learner ran" in text
    assert "trials trained: gpu0 5 on the CPU" in text


@pytest.mark.slow
def test_an_explicit_device_is_obeyed_without_measuring(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "study.n_trials=2", "objective.n_rows=2000",
                     "objective.num_boost_round=20", "objective.report_every=5",
                     "objective.device=cpu", "scheduler.parallel=1",
                     env={"HPO_ORCHESTRATOR_FAKE_GPUS": "1"})
    assert result.code == 0, result.stderr
    for row in trial_rows(result.db):
        assert "hpo.device_choice" not in row["attrs"]
        assert row["attrs"]["hpo.params_effective"]["device_type"] == "cpu"


def test_low_gpu_util_says_auto_chose_the_cpu() -> None:
    from hpo_orchestrator.status import DeviceUse, StatusReport
    from hpo_orchestrator.status._findings import _low_utilization

    def report(choices: list[dict[str, Any]]) -> StatusReport:
        return StatusReport(
            study="s", direction="minimize", n_trials_target=None, states={}, prune_rate=None,
            prune_steps={}, best=None, running=[], device_choices=choices,
            per_device=[DeviceUse("gpu0", "h", 0, util_mean=2.0, util_compute_mean=1.0)])

    chose_cpu = {"host": "h", "learner": "cpu", "reason": "CPU (16 threads) 0.90 s per trial "
                 "against cuda 4.00 s", "trial": 0}
    [finding] = _low_utilization(report([chose_cpu]), {"objective": {"name": "lightgbm"}})
    assert finding.severity == "info" and "measured the CPU faster" in finding.message
    assert "not needed" in finding.message
    [plain] = _low_utilization(report([]), {"objective": {"name": "lightgbm"}})
    assert plain.severity == "warning" and "objective.device=cpu" in plain.advice
    on_gpu = {**chose_cpu, "learner": "cuda"}
    [other] = _low_utilization(report([on_gpu]), {"objective": {"name": "lightgbm"}})
    assert other.severity == "warning"
    # the seventh session's (b) run: the latest measurement chose the CPU (for 251 leaves),
    # while 41 of the GPU's 44 trials trained on CUDA: the GPU was needed, and underused
    mostly_cuda = {**chose_cpu, "learners": {"0": {"cuda": 41, "cpu": 3}}}
    [starved] = _low_utilization(report([mostly_cuda]), {"objective": {"name": "lightgbm"}})
    assert starved.severity == "warning" and "not needed" not in starved.message
    mostly_cpu = {**on_gpu, "learners": {"0": {"cuda": 2, "cpu": 40}, "1": {"cuda": 9}}}
    [idle] = _low_utilization(report([mostly_cpu]), {"objective": {"name": "lightgbm"}})
    assert idle.severity == "info" and "not needed" in idle.message
    # counts for other GPUs only: nothing known of this one's, whatever the latest measurement
    elsewhere = {**chose_cpu, "learners": {"1": {"cpu": 9}}}
    [unknown] = _low_utilization(report([elsewhere]), {"objective": {"name": "lightgbm"}})
    assert unknown.severity == "warning" and "not needed" not in unknown.message


def test_the_device_choice_line_says_where_each_gpus_trials_trained() -> None:
    from hpo_orchestrator.status import device_choice_line

    entry = {"host": "vm", "learner": "cpu", "trial": 12, "reason": "CPU (11 threads) 5.83 s "
             "per trial against cuda 9.00 s", "learners": {"10": {"cuda": 48},
                                                           "2": {"cuda": 41, "cpu": 3}}}
    assert device_choice_line(entry) == (
        "objective.device=auto on vm: the latest measurement (trial 12) chose the CPU: CPU (11 "
        "threads) 5.83 s per trial against cuda 9.00 s; trials trained: gpu2 3 on the CPU, 41 "
        "on cuda; gpu10 48 on cuda")


def _answer_at(calibration: Calibration, leaves: int, cpu: float, cuda: float | None,
               cuda_overhead: float = 0.0) -> None:
    """Record a measured answer at ``leaves`` from scripted seconds per round (and CUDA's
    seconds before its first round)."""
    timings = {"cpu": cpu, "cuda": cuda}

    def train(params: dict[str, Any], rounds: int, tick: Any) -> None:
        per_round = timings[params["device_type"]]
        if per_round is None:
            raise RuntimeError("CUDA Tree Learner was not enabled in this build")
        clock[0] += cuda_overhead if params["device_type"] == "cuda" else 0.0
        for _ in range(rounds):
            clock[0] += per_round
            tick(None)

    clock = [0.0]
    original = _device.time.perf_counter
    _device.time.perf_counter = lambda: clock[0]  # type: ignore[assignment]
    try:
        calibration.choose(picture("d", {"num_leaves": leaves}),
                           {"cpu": {"device_type": "cpu"}, "cuda": {"device_type": "cuda"}},
                           {}, train, 200, 11)
    finally:
        _device.time.perf_counter = original  # type: ignore[assignment]


def test_between_two_measured_tree_sizes_each_learners_figures_are_interpolated() -> None:
    """The seventh session's (b) run: CUDA measured faster at 33 leaves (0.009 s a round against
    the CPU's 0.0217), the CPU by a hair at 166 (0.0313 against 0.0303, within GPU_MARGIN).
    The nearer picture's answer sent trees of 76 leaves to the CPU; interpolated in
    log(num_leaves), CUDA's 0.0169 s a round beats the CPU's 0.0262 there."""
    calibration = Calibration()
    _answer_at(calibration, 33, cpu=0.0217, cuda=0.009, cuda_overhead=0.1)
    _answer_at(calibration, 166, cpu=0.0313, cuda=0.0303, cuda_overhead=0.5)
    assert [a["learner"] for _, a in calibration._answers] == ["cuda", "cpu"]
    never = lambda *_: pytest.fail("nothing is measured between two pictures")  # noqa: E731
    learners = {"cpu": {"device_type": "cpu"}, "cuda": {"device_type": "cuda"}}
    answer, measured = calibration.choose(picture("d", {"num_leaves": 76}), learners, {}, never,
                                          200, 11)
    assert not measured and answer["learner"] == "cuda"
    assert answer["measured_num_leaves"] == [33, 166]
    assert answer["reason"].startswith("cuda 3.") and "between 33 and 166 leaves" in answer["reason"]
    cuda = next(t for t in answer["timings"] if t["learner"] == "cuda")
    assert cuda["s_per_round"] == pytest.approx(0.009 ** 0.4825 * 0.0303 ** 0.5175, rel=0.01)
    assert cuda["overhead_s"] == pytest.approx(0.1 + 0.5175 * 0.4, rel=0.01)  # linear
    # close to the CPU's end the CPU answer holds
    assert calibration.choose(picture("d", {"num_leaves": 160}), learners, {}, never, 200,
                              11)[0]["learner"] == "cpu"


def test_a_learner_that_failed_at_either_end_is_not_interpolated() -> None:
    calibration = Calibration()
    _answer_at(calibration, 16, cpu=0.02, cuda=0.001)
    _answer_at(calibration, 70, cpu=0.03, cuda=None)  # CUDA failed there (say, out of memory)
    assert len(calibration._answers) == 2
    answer, _ = calibration.choose(
        picture("d", {"num_leaves": 30}),
        {"cpu": {"device_type": "cpu"}, "cuda": {"device_type": "cuda"}}, {},
        lambda *_: pytest.fail("nothing is measured between two pictures"), 200, 11)
    assert answer["learner"] == "cpu" and "cuda: RuntimeError: CUDA Tree Learner" in answer["reason"]


@pytest.mark.parametrize(("learners", "rows", "threads", "expected"), [
    (["cuda", "cpu"], 1_000_000, 8, "cuda"),  # workload b: 40M cells on 8 threads
    (["cuda", "cpu"], 1_000_000, 16, "cuda"),  # exactly at 2.5M cells a thread
    (["cuda", "cpu"], 999_999, 16, "cpu"),
    (["cuda", "cpu"], 40_000, 1, "cpu"),  # the default study: CPU at any thread count
    (["gpu", "cpu"], 10_000_000, 4, "cpu"),  # OpenCL is never the guess
    (["cpu"], 10_000_000, 1, "cpu"),
])
def test_the_likely_learner_before_measuring(learners: list[str], rows: int, threads: int,
                                             expected: str) -> None:
    from hpo_orchestrator.objectives._device import likely_learner

    learner, reason = likely_learner(learners, rows, 40, threads)
    assert learner == expected
    assert reason.startswith(f"not measured yet: {rows:,} rows x 40 features on {threads} CPU")


def test_a_worker_guesses_once_then_measures() -> None:
    """The first trial trains on the guess; the next measures; a new worker guesses again,
    but not for a picture it already has an answer near."""
    from hpo_orchestrator.objectives._device import Calibration, picture

    calibration = Calibration()
    key = picture("data", {"num_leaves": 31, "num_threads": 8})
    guessed = calibration.guess(key, ["cuda", "cpu"], 2_000_000, 40, 200, 8)
    assert guessed is not None and guessed["learner"] == "cuda" and guessed["guessed"]
    assert calibration.guess(key, ["cuda", "cpu"], 2_000_000, 40, 200, 8) is None
    answer, measured = calibration.choose(
        key, {"cpu": {"device_type": "cpu"}}, {}, lambda *_: None, 200, 8)
    assert measured and answer["learner"] == "cpu"
    other = Calibration()
    other._answers.append((key, answer))  # an answer near this picture: no guess needed
    assert other.guess(key, ["cuda", "cpu"], 2_000_000, 40, 200, 8) is None
