"""objective.device=auto's answers reused beyond their exact picture (objectives/_device.py):
a GPU win at fewer threads, a CPU win at more, and across the workers of a run on one host
through their shared folder (objectives/_shared_answers.py). Scripted timings, no GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpo_orchestrator.objectives import _device
from hpo_orchestrator.objectives._device import (
    ANOTHER_WORKER,
    MEASURED,
    THIS_WORKER,
    Calibration,
    SharedAnswers,
    picture,
)

LEARNERS = {"cpu": {"device_type": "cpu"}, "cuda": {"device_type": "cuda", "gpu_device_id": 0}}
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "lightgbm": "4.7.0"}


class Scripted:
    """A train function on a scripted clock: ``per_round`` seconds a round per learner."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, per_round: dict[str, float]) -> None:
        self.clock = 0.0
        self.per_round = per_round
        self.runs: list[str] = []
        monkeypatch.setattr(_device.time, "perf_counter", lambda: self.clock)

    def __call__(self, params: dict[str, Any], rounds: int, tick: Any) -> None:
        self.runs.append(params["device_type"])
        for _ in range(rounds):
            self.clock += self.per_round[params["device_type"]]
            tick(None)


def _choose(calibration: Calibration, train: Scripted, threads: int,
            leaves: int = 31) -> tuple[dict[str, Any], str]:
    key = picture("data", {"max_bin": 63, "num_threads": threads, "num_leaves": leaves})
    return calibration.choose(key, LEARNERS, {}, train, 200, threads)


def test_a_gpu_answer_holds_at_fewer_threads_not_at_more(monkeypatch: pytest.MonkeyPatch) -> None:
    train = Scripted(monkeypatch, {"cpu": 0.08, "cuda": 0.02})
    calibration = Calibration()
    answer, source = _choose(calibration, train, 11)
    assert answer["learner"] == "cuda" and source == MEASURED and answer["measured_num_threads"] == 11
    for threads in (11, 5, 3, 2, 1):  # trials_per_gpu=auto's levels re-dividing the cores
        again, source = _choose(calibration, train, threads, leaves=60)
        assert again is answer and source == THIS_WORKER
    assert train.runs == ["cpu", "cuda"]
    _, source = _choose(calibration, train, 16)  # more threads: the CPU may win there
    assert source == MEASURED and train.runs == ["cpu", "cuda"] * 2
    _, source = _choose(calibration, train, 5, leaves=31 * 4)  # leaves a factor away
    assert source == MEASURED


def test_a_cpu_answer_holds_at_more_threads_not_at_fewer(monkeypatch: pytest.MonkeyPatch) -> None:
    train = Scripted(monkeypatch, {"cpu": 0.01, "cuda": 0.05})
    calibration = Calibration()
    answer, source = _choose(calibration, train, 4)
    assert answer["learner"] == "cpu" and source == MEASURED
    for threads in (4, 8, 32):
        assert _choose(calibration, train, threads) == (answer, THIS_WORKER)
    assert train.runs == ["cpu", "cuda"]
    _, source = _choose(calibration, train, 2)
    assert source == MEASURED and len(train.runs) == 4


def test_the_nearest_answer_is_taken_where_several_hold() -> None:
    """Noisy measurements can disagree: a GPU win at 11 threads and a CPU win at 2 both hold
    at 3 to 10 threads; the nearer in threads (and leaves) decides."""
    gpu_at_11 = picture("d", {"num_threads": 11, "num_leaves": 31})
    cpu_at_2 = picture("d", {"num_threads": 2, "num_leaves": 31})
    at_5 = picture("d", {"num_threads": 5, "num_leaves": 31})
    assert at_5.reach(gpu_at_11, "cuda") == pytest.approx(11 / 5)
    assert at_5.reach(cpu_at_2, "cpu") == pytest.approx(5 / 2)
    assert at_5.reach(gpu_at_11, "cpu") == float("inf")  # a CPU win says nothing below
    assert at_5.reach(cpu_at_2, "cuda") == float("inf")
    no_threads = picture("d", {"num_leaves": 31})  # LightGBM's default: only itself
    assert no_threads.reach(gpu_at_11, "cuda") == float("inf")
    assert no_threads.reach(picture("d", {"num_leaves": 40}), "cuda") < float("inf")
    assert picture("e", {"num_threads": 5}).reach(gpu_at_11, "cuda") == float("inf")

    calibration = Calibration()
    gpu = {"learner": "cuda", "reason": "scripted"}
    cpu = {"learner": "cpu", "reason": "scripted"}
    calibration._answers += [(gpu_at_11, gpu, THIS_WORKER), (cpu_at_2, cpu, THIS_WORKER)]

    def never(*_: Any) -> None:
        raise AssertionError("an answer held: nothing is measured")

    for threads, expected in ((5, gpu), (3, cpu), (10, gpu), (2, cpu), (12, cpu), (1, gpu)):
        key = picture("d", {"num_threads": threads, "num_leaves": 31})
        assert calibration.choose(key, LEARNERS, {}, never, 200, threads)[0] is expected


def test_an_answer_is_shared_with_another_worker_of_the_run(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    folder = tmp_path / "shared-host-1"  # created by the first writer
    train = Scripted(monkeypatch, {"cpu": 0.08, "cuda": 0.02})
    first = Calibration(SharedAnswers(folder, H100))
    answer, _ = _choose(first, train, 11)
    assert len(list(folder.glob("device-*.json"))) == 1
    assert not list(folder.glob(".*"))  # no temporary file left
    second = Calibration(SharedAnswers(folder, dict(H100)))  # a spare started later
    reused, source = _choose(second, train, 5)
    assert source == ANOTHER_WORKER and reused == answer and train.runs == ["cpu", "cuda"]
    assert _choose(second, train, 3) == (reused, ANOTHER_WORKER)  # kept once read
    _, source = _choose(second, train, 16)  # more threads: measured, and written for others
    assert source == MEASURED and len(list(folder.glob("device-*.json"))) == 2
    assert _choose(first, train, 16)[1] == ANOTHER_WORKER


def test_another_gpu_model_or_other_learners_do_not_share(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    train = Scripted(monkeypatch, {"cpu": 0.08, "cuda": 0.02})
    _choose(Calibration(SharedAnswers(tmp_path, H100)), train, 11)
    for context in ({**H100, "gpu": "NVIDIA A100-SXM4-40GB"}, {**H100, "lightgbm": "4.6.0"}):
        assert _choose(Calibration(SharedAnswers(tmp_path, context)), train, 11)[1] == MEASURED
    opencl = {**LEARNERS, "gpu": {"device_type": "gpu", "gpu_platform_id": 1}}
    key = picture("data", {"max_bin": 63, "num_threads": 11, "num_leaves": 31})
    read = list(SharedAnswers(tmp_path, H100).read(key.fixed, LEARNERS))
    assert [(threads, leaves, answer["learner"]) for threads, leaves, answer in read] == [(11, 31, "cuda")]
    assert list(SharedAnswers(tmp_path, H100).read(key.fixed, opencl)) == []
    other_bins = picture("data", {"max_bin": 255, "num_threads": 11, "num_leaves": 31})
    assert list(SharedAnswers(tmp_path, H100).read(other_bins.fixed, LEARNERS)) == []


@pytest.mark.parametrize("content", [b"", b'{"format": 1, "scope": ', b"\xff\xfe not json",
                                     b"[1, 2]", b'{"format": 1}', b"null"])
def test_a_corrupt_shared_file_is_ignored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          content: bytes) -> None:
    train = Scripted(monkeypatch, {"cpu": 0.08, "cuda": 0.02})
    _choose(Calibration(SharedAnswers(tmp_path, H100)), train, 11)
    [good] = tmp_path.glob("device-*.json")
    good.write_bytes(content)  # truncated, garbled, another shape
    (tmp_path / "device-a-folder.json").mkdir()
    answer, source = _choose(Calibration(SharedAnswers(tmp_path, H100)), train, 5)
    assert source == MEASURED and answer["learner"] == "cuda"


def test_a_wrong_answer_shape_or_an_unusable_folder_never_fails_a_trial(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    train = Scripted(monkeypatch, {"cpu": 0.08, "cuda": 0.02})
    _choose(Calibration(SharedAnswers(tmp_path, H100)), train, 11)
    [path] = tmp_path.glob("device-*.json")
    record = json.loads(path.read_text())
    for number, bad in enumerate(({**record, "answer": {**record["answer"], "learner": "tpu"}},
                                  {**record, "threads": "11"}, {**record, "leaves": 0},
                                  {**record, "answer": []}, {**record, "format": 2})):
        folder = tmp_path / f"case-{number}"
        folder.mkdir()
        (folder / path.name).write_text(json.dumps(bad))
        assert _choose(Calibration(SharedAnswers(folder, H100)), train, 5)[1] == MEASURED
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    calibration = Calibration(SharedAnswers(not_a_folder / "shared", H100))
    assert _choose(calibration, train, 11)[1] == MEASURED  # neither read nor written: measured
    assert _choose(calibration, train, 5)[1] == THIS_WORKER


def test_the_scheduler_names_the_shared_folder_and_the_gpu_model(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child learns its shared folder and GPU model from its environment (worker/_env.py);
    the LightGBM objective shares only where it knows both."""
    from types import SimpleNamespace

    from hpo_orchestrator import slot_info
    from hpo_orchestrator.config import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective
    from hpo_orchestrator.worker import ChildEnv

    env = ChildEnv(trial_number=1, attempt=1, slot=0, gpu_index=0, gpu_uuid="GPU-0",
                   cuda_visible_devices="GPU-0", num_threads=4, gpu_name="NVIDIA H100",
                   shared_dir=str(tmp_path))
    assert ChildEnv.parse(env.render()) == env
    for name, value in env.render().items():
        monkeypatch.setenv(name, value)
    assert (slot_info().gpu_name, slot_info().shared_dir) == ("NVIDIA H100", str(tmp_path))

    objective = LightGBMObjective(LightGBMObjectiveConfig(n_rows=200))
    for gpu_name, shared_dir in ((None, str(tmp_path)), ("NVIDIA H100", None)):
        objective._share_answers(SimpleNamespace(gpu_name=gpu_name, shared_dir=shared_dir))
        assert objective.calibration.shared is None  # plain Optuna, or a model unknown
    objective._share_answers(slot_info())
    shared = objective.calibration.shared
    assert shared is not None and shared.folder == tmp_path
    assert shared.context["gpu"] == "NVIDIA H100"
