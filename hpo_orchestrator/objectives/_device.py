"""``objective.device=auto`` for LightGBM: train where this study's trials run faster, measured.

On the `make hpo` study's 40k rows, 16 CPU threads trained 200 rounds in 0.87 s, LightGBM's
CUDA learner in 3.0 s and its OpenCL learner in 7.1 s; at 2M rows the CUDA learner was 2.3x
the CPU (docs/GPU.md, "CPU or GPU for one LightGBM training"). Which side wins depends on the
data and the params, so a trial on a GPU slot measures it: a short training on the study's
own data, with the trial's params, on the CPU with the threads this slot gives and on one
GPU learner: CUDA where LightGBM was built with it, else OpenCL on NVIDIA's platform. Beside
CUDA, OpenCL is not measured unless ``objective.gpu_platform`` names a platform: it was slower
than CUDA or tied with it in every measurement (docs/GPU.md), and its kernel build costs
seconds per measurement. OpenCL runs twice so that its kernel build is left out of the
figures; CPU and CUDA once (the CUDA check has made this process's CUDA context). The
estimate of a whole trial, ``overhead + rounds x seconds per round``, decides; a GPU learner
must win by ``GPU_MARGIN``.

An answer is kept and reused for a picture (:class:`Picture`: the data, ``max_bin``, the CPU
threads, ``num_leaves``) that it holds for: the same data and ``max_bin``, ``num_leaves`` within
``LEAVES_FACTOR`` of the measured one, and the same thread count, or fewer threads where a GPU
learner won, or more where the CPU won. The CPU learner only gets slower with fewer threads,
and a GPU learner's time depended little on them where it was seen (docs/QUALITY.md, workload
b: as the levels split the cores to 2-3 threads a trial, CUDA took 4.7-6.2 s a trial against
the CPU's 16-20 s), so a GPU win at 11 threads is taken to stand at 5. (A GPU learner bins its
Dataset on the CPU threads: that part of its overhead does grow with fewer.)
Where several answers hold, the nearest picture's is taken (the product of the thread and
leaf ratios). Before that rule, ``scheduler.trials_per_gpu=auto`` re-dividing the cores
(11 -> 5 -> 3 -> 2 threads a trial) made every worker measure CPU and CUDA again on the 1M
rows at each new level, with the same answer each time (docs/QUALITY.md, workload b).

Answers are also shared between the workers of one run on one host: the orchestrator names a
folder (``slot_info().shared_dir``, a run folder's ``shared-<host>-<pid>``) and
:class:`SharedAnswers` keeps one JSON file per measured answer there, keyed by what decides it
(the picture, the GPU's model, the learners measured and LightGBM's version), written whole
(temporary file + ``os.replace``) and read before measuring; a file that does not parse is
ignored. Two workers that miss at once both measure (nothing waits for another's
measurement). Outside the scheduler (plain Optuna, tests) each process keeps its own.
Neither the monotone rule nor the sharing has been measured on a GPU host yet.

Each measurement costs a few trainings of 20 rounds on the study's data: on 1M rows,
measuring all three learners twice at every power of two of ``num_leaves`` made ours' first
results come about 1.5x later (docs/QUALITY.md, workload b).

:func:`pick` is the pure rule (unit-tested with scripted timings); :class:`Calibration`
measures and remembers.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hpo_orchestrator.objectives._shared_answers import SharedAnswers

__all__ = ["ANOTHER_WORKER", "GPU_MARGIN", "LEAVES_FACTOR", "MEASURED", "THIS_WORKER",
           "Calibration", "Picture", "SharedAnswers", "Timing", "cuda_learner_available", "pick",
           "picture"]

GPU_MARGIN = 1.1  # a GPU trial also holds a GPU another trial could use: ask for a clear win
CALIBRATION_ROUNDS = 20
LEAVES_FACTOR = 4  # an answer holds for num_leaves within this factor of a measured picture's


@dataclass(frozen=True)
class Timing:
    """One learner's measurement: seconds per boosting round, and the rest of a training
    (a GPU learner's Dataset construction, which its every trial pays; the learner's set-up) as
    ``overhead_s``; ``error`` where it cannot run. The CPU learner's Datasets are built once
    per worker, before the timing (``Calibration.choose``'s ``prepare``)."""

    learner: str  # cpu, cuda or gpu (LightGBM's device_type)
    s_per_round: float | None = None
    overhead_s: float | None = None
    error: str | None = None

    def estimate_s(self, rounds: int) -> float | None:
        if self.s_per_round is None or self.overhead_s is None:
            return None
        return self.overhead_s + rounds * self.s_per_round


def pick(timings: list[Timing], rounds: int, cpu_threads: int) -> tuple[str, str]:
    """The learner a trial of ``rounds`` rounds should use, and why (a sentence)."""
    cpu = next((t for t in timings if t.learner == "cpu"), Timing("cpu"))
    cpu_s = cpu.estimate_s(rounds)
    usable = [(t.estimate_s(rounds), t) for t in timings if t.learner != "cpu"]
    gpu_s, gpu = min(((s, t) for s, t in usable if s is not None), default=(None, None),
                     key=lambda pair: pair[0] or 0.0)
    cpu_text = f"CPU ({cpu_threads} threads) {_seconds(cpu_s)}"
    if gpu is None or gpu_s is None:
        errors = "; ".join(f"{t.learner}: {t.error}" for t in timings if t.error) or "none found"
        return "cpu", f"no GPU learner ran ({errors}); {cpu_text}"
    gpu_text = f"{gpu.learner} {_seconds(gpu_s)}"
    if cpu_s is None or gpu_s * GPU_MARGIN < cpu_s:
        return gpu.learner, f"{gpu_text} per trial against {cpu_text}"
    return "cpu", f"{cpu_text} per trial against {gpu_text}"


def _seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.2f} s"


@dataclass(frozen=True)
class Picture:
    """What decides the answer: the data (a hashable description of it) and the bins exactly;
    the CPU threads (``threads``) in one direction (:meth:`reach`); the tree size
    (``num_leaves``) roughly."""

    fixed: tuple[Any, ...]
    leaves: int
    threads: int | None = None

    def distance(self, other: Picture) -> float:
        """How many times larger one tree size is than the other; inf for other data, bins
        or threads."""
        if self.fixed != other.fixed or self.threads != other.threads:
            return float("inf")
        return max(self.leaves, other.leaves) / min(self.leaves, other.leaves)

    def near(self, other: Picture) -> bool:
        """The same picture but for ``num_leaves`` within ``LEAVES_FACTOR``."""
        return self.distance(other) < LEAVES_FACTOR

    def reach(self, measured: Picture, learner: str) -> float:
        """How far an answer measured at ``measured`` that chose ``learner`` is from this
        picture (the product of the leaf and thread ratios); inf where it does not hold. It
        holds at other thread counts in one direction only (module docstring): a GPU
        learner's win at fewer threads, the CPU's at more."""
        if self.fixed != measured.fixed:
            return float("inf")
        leaves = max(self.leaves, measured.leaves) / min(self.leaves, measured.leaves)
        if leaves >= LEAVES_FACTOR:
            return float("inf")
        if self.threads == measured.threads:
            return leaves
        if not self.threads or not measured.threads:  # unknown (LightGBM's default): exact only
            return float("inf")
        fewer = self.threads < measured.threads
        if fewer != (learner != "cpu"):
            return float("inf")
        return leaves * max(self.threads, measured.threads) / min(self.threads, measured.threads)


def picture(data: Any, params: dict[str, Any]) -> Picture:
    """The picture a trial of ``params`` on ``data`` trains in."""
    threads = params.get("num_threads")
    return Picture((data, params.get("max_bin")), max(int(params.get("num_leaves", 31)), 2),
                   int(threads) if threads is not None else None)


def _train_timing(learner: str, train: Callable[[dict[str, Any], int, Any], None],
                  params: dict[str, Any], rounds: int) -> Timing:
    """Time ``train`` (lgb.train, with a GPU learner's Dataset construction); OpenCL twice, the
    second run giving the figures."""
    ticks: list[float] = []

    def tick(_env: Any) -> None:
        ticks.append(time.perf_counter())

    try:
        for _ in range(2 if params.get("device_type") == "gpu" else 1):  # OpenCL: kernels
            ticks.clear()
            start = time.perf_counter()
            train(params, rounds, tick)
            total = time.perf_counter() - start
    except Exception as exc:  # a learner this build or host lacks
        return Timing(learner, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    steps = [b - a for a, b in itertools.pairwise(ticks)]
    per_round = statistics.median(steps) if steps else total / max(rounds, 1)
    return Timing(learner, s_per_round=per_round, overhead_s=max(0.0, total - rounds * per_round))


def cuda_learner_available() -> tuple[bool, str | None]:
    """Was this LightGBM built with its CUDA learner? (PyPI's wheel is not: docs/GPU.md.)"""
    import lightgbm as lgb
    import numpy as np

    x = np.arange(400, dtype=np.float64).reshape(200, 2)
    try:
        lgb.train({"objective": "binary", "device_type": "cuda", "verbosity": -1},
                  lgb.Dataset(x, np.arange(200) % 2), num_boost_round=1)
    except Exception as exc:
        return False, str(exc).splitlines()[0][:200]
    return True, None


# Where an answer came from (``Calibration.choose``; hpo.device_choice's ``source``).
MEASURED, THIS_WORKER, ANOTHER_WORKER = "measured", "this worker", "another worker"


class Calibration:
    """Measured answers of one worker process, by picture; with ``shared``, also those the
    other workers of the run on this host measured."""

    def __init__(self, shared: SharedAnswers | None = None) -> None:
        self._answers: list[tuple[Picture, dict[str, Any], str]] = []
        self.shared = shared

    def _closest(self, key: Picture) -> tuple[dict[str, Any], str] | None:
        reach, answer, origin = min(
            ((key.reach(measured, answer["learner"]), answer, origin)
             for measured, answer, origin in self._answers),
            key=lambda entry: entry[0], default=(float("inf"), {}, ""))
        return (answer, origin) if reach < float("inf") else None

    def choose(self, key: Picture, learners: dict[str, dict[str, Any]],
               base_params: dict[str, Any], train: Callable[[dict[str, Any], int, Any], None],
               rounds: int, cpu_threads: int,
               prepare: Callable[[], None] | None = None) -> tuple[dict[str, Any], str]:
        """The choice for ``key`` (``hpo.device_choice``) and where it came from: ``MEASURED``
        now, or an answer that holds for ``key`` (:meth:`Picture.reach`) from ``THIS_WORKER``
        or ``ANOTHER_WORKER`` (through ``shared``, read only when this process has none).

        ``learners``: learner name -> its device params (``cpu`` always among them; the same
        for every call of one process, as its GPU is).
        ``prepare``: run before measuring, untimed (work later trials will not repeat).
        """
        found = self._closest(key)
        if found is None and self.shared is not None:
            for threads, leaves, answer in self.shared.read(key.fixed, learners):
                shared = Picture(key.fixed, leaves, threads)
                if all(measured != shared for measured, _, _ in self._answers):  # read before
                    self._answers.append((shared, answer, ANOTHER_WORKER))
            found = self._closest(key)
        if found is not None:
            return found
        if prepare is not None:
            prepare()
        timings = [_train_timing(name, train, {**base_params, **device}, CALIBRATION_ROUNDS)
                   for name, device in learners.items()]
        learner, reason = pick(timings, rounds, cpu_threads)
        answer = {"learner": learner, "reason": reason, "rounds": rounds,
                  "measured_num_leaves": key.leaves, "measured_num_threads": key.threads,
                  "timings": [asdict(t) for t in timings]}
        self._answers.append((key, answer, THIS_WORKER))
        if self.shared is not None:
            self.shared.write(key.fixed, key.threads, key.leaves, learners, answer)
        return answer, MEASURED
