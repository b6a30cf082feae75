"""``objective.device=auto`` for LightGBM: train where this study's trials run faster, measured.

On the `make hpo` study's 40k rows, 16 CPU threads trained 200 rounds in 0.87 s, LightGBM's
CUDA learner in 3.0 s and its OpenCL learner in 7.1 s; at 2M rows the CUDA learner was 2.3x
the CPU (docs/GPU.md, "CPU or GPU for one LightGBM training"). Which side wins depends on the
data and the params, so a trial on a GPU slot measures it: a short training on the study's
own data, with the trial's params, on the CPU with the threads this slot gives and on one
GPU learner: CUDA where LightGBM was built with it, else OpenCL on NVIDIA's platform. Beside
CUDA, OpenCL is not measured unless ``objective.gpu_platform`` names a platform: it was slower
than CUDA or tied with it in every measurement (docs/GPU.md), and its kernel build costs
seconds per measurement. A GPU learner runs twice and its faster run counts, so that what a
process pays once (OpenCL's kernel build; CUDA's first kernels and allocations, and its
Datasets, built once per worker) is left out of the figures; the CPU once, after its Datasets
are binned (untimed). The
estimate of a whole trial, ``overhead + rounds x seconds per round``, decides; a GPU learner
must win by ``GPU_MARGIN``. The answer is kept for the worker process and measured again
when the picture changes: another data shape, ``max_bin`` or thread count, or
``num_leaves`` ``LEAVES_FACTOR`` times away from every picture measured; a tree size between
two measured ones gets each learner's figures interpolated from both. Each measurement
costs a few trainings of 20 rounds on the study's data: on 1M rows, measuring all three
learners twice at every power of two of ``num_leaves`` made ours' first results come about
1.5x later (docs/QUALITY.md, workload b).

:func:`pick` is the pure rule (unit-tested with scripted timings); :class:`Calibration`
measures and remembers.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GPU_MARGIN", "LEAVES_FACTOR", "LIKELY_CUDA_CELLS_PER_THREAD", "Calibration", "Picture",
           "Timing", "cuda_learner_available", "likely_learner", "pick", "picture", "timed_run"]

GPU_MARGIN = 1.1  # a GPU trial also holds a GPU another trial could use: ask for a clear win
CALIBRATION_ROUNDS = 20
LEAVES_FACTOR = 4  # an answer holds for num_leaves within this factor of a measured picture's
# Where a worker's first trial trains before anything is measured: on CUDA from this many
# cells (rows x features) per CPU thread of the trial. On an H100 host 16 threads trained 40k
# x 40 generated rows 3.4x faster than CUDA, 2M rows 2.4x slower, and 1M rows within 4-37 %
# either way at 11-16 threads (docs/GPU.md): the two cross near 40M cells on 16 threads.
LIKELY_CUDA_CELLS_PER_THREAD = 2_500_000


@dataclass(frozen=True)
class Timing:
    """One learner's measurement: seconds per boosting round, and the rest of a training (the
    learner's set-up; OpenCL's Dataset construction, which its every trial pays) as
    ``overhead_s``; ``error`` where it cannot run. The CPU learner's Datasets are built once
    per worker, before the timing (``Calibration.choose``'s ``prepare``); the CUDA learner's
    once too, in the first of its two timed runs."""

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


def likely_learner(learners: list[str], rows: int, features: int,
                   cpu_threads: int) -> tuple[str, str]:
    """Where a trial trains before this worker has measured anything, and why (a sentence):
    CUDA on data large for the trial's threads (``LIKELY_CUDA_CELLS_PER_THREAD``), else the
    CPU. OpenCL is never the guess: it was slower than the CPU or CUDA in every measurement
    (docs/GPU.md)."""
    shape = f"{rows:,} rows x {features} features on {cpu_threads} CPU thread(s)"
    if "cuda" in learners and rows * features >= LIKELY_CUDA_CELLS_PER_THREAD * max(cpu_threads, 1):
        return "cuda", f"not measured yet: {shape}, likely faster on CUDA"
    return "cpu", f"not measured yet: {shape}, likely faster on the CPU"


def _seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.2f} s"


@dataclass(frozen=True)
class Picture:
    """What decides the answer: the data (a hashable description of it), the bins and the
    CPU threads exactly; the tree size (``num_leaves``) roughly."""

    fixed: tuple[Any, ...]
    leaves: int

    def distance(self, other: Picture) -> float:
        """How many times larger one tree size is than the other; inf for other data, bins
        or threads."""
        if self.fixed != other.fixed:
            return float("inf")
        return max(self.leaves, other.leaves) / min(self.leaves, other.leaves)

    def near(self, other: Picture) -> bool:
        return self.distance(other) < LEAVES_FACTOR


def picture(data: Any, params: dict[str, Any]) -> Picture:
    """The picture a trial of ``params`` on ``data`` trains in."""
    return Picture((data, params.get("max_bin"), params.get("num_threads")),
                   max(int(params.get("num_leaves", 31)), 2))


def timed_run(learner: str, train: Callable[[dict[str, Any], int, Any], None],
              params: dict[str, Any], rounds: int) -> Timing:
    """One timed ``train`` (lgb.train, with a GPU learner's Dataset construction): the median
    of its rounds and the rest as overhead. Raises what ``train`` raises."""
    ticks: list[float] = []
    start = time.perf_counter()
    train(params, rounds, lambda _env: ticks.append(time.perf_counter()))
    total = time.perf_counter() - start
    steps = [b - a for a, b in itertools.pairwise(ticks)]
    per_round = statistics.median(steps) if steps else total / max(rounds, 1)
    return Timing(learner, s_per_round=per_round, overhead_s=max(0.0, total - rounds * per_round))


def _train_timing(learner: str, train: Callable[[dict[str, Any], int, Any], None],
                  params: dict[str, Any], rounds: int) -> Timing:
    """A learner's measurement. A GPU learner trains twice and the faster run gives the
    figures: a process's first training on one pays what later ones do not (OpenCL its kernel
    build; CUDA its lazily loaded kernels, first allocations and the Datasets its trials then
    reuse), and the answer is for the trials after it."""
    try:
        runs = [timed_run(learner, train, params, rounds)
                for _ in range(1 if learner == "cpu" else 2)]
    except Exception as exc:  # a learner this build or host lacks
        return Timing(learner, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return min(runs, key=lambda run: run.estimate_s(rounds) or 0.0)


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


class Calibration:
    """Measured answers of one worker process, by picture."""

    def __init__(self) -> None:
        self._answers: list[tuple[Picture, dict[str, Any]]] = []
        self._guessed = False  # a trial already ran on likely_learner's guess

    def guess(self, key: Picture, learners: list[str], rows: int, features: int,
              rounds: int, cpu_threads: int) -> dict[str, Any] | None:
        """The worker's first trial trains at once on :func:`likely_learner`'s guess, so that
        measuring keeps no first result waiting (the default study's first trial came 2-6 s
        later with the measurement than with objective.device=cpu set by hand, on two H200s:
        docs/QUALITY.md); its next trial measures (:meth:`choose`). None after the first, or
        where an answer near ``key`` is known."""
        if self._guessed or any(picture_.near(key) for picture_, _ in self._answers):
            return None
        self._guessed = True
        learner, reason = likely_learner(learners, rows, features, cpu_threads)
        return {"learner": learner, "reason": f"{reason} (measured at this worker's next trial)",
                "rounds": rounds, "guessed": True}

    def choose(self, key: Picture, learners: dict[str, dict[str, Any]],
               base_params: dict[str, Any], train: Callable[[dict[str, Any], int, Any], None],
               rounds: int, cpu_threads: int,
               prepare: Callable[[], None] | None = None) -> tuple[dict[str, Any], bool]:
        """The choice for ``key`` (``hpo.device_choice``): measured now (True), or from the
        pictures measured before near this one: between two, each learner's figures
        interpolated (:func:`_between`); else the nearest one's answer.

        ``learners``: learner name -> its device params (``cpu`` always among them).
        ``prepare``: run before measuring, untimed (work later trials will not repeat).
        """
        near = [(picture_, answer) for picture_, answer in self._answers if picture_.near(key)]
        below = max((m for m in near if m[0].leaves < key.leaves), default=None,
                    key=lambda m: m[0].leaves)
        above = min((m for m in near if m[0].leaves > key.leaves), default=None,
                    key=lambda m: m[0].leaves)
        if below is not None and above is not None:
            return _between(key, below, above, rounds, cpu_threads), False
        if near:
            return min(near, key=lambda measured: measured[0].distance(key))[1], False
        if prepare is not None:
            prepare()
        timings = [_train_timing(name, train, {**base_params, **device}, CALIBRATION_ROUNDS)
                   for name, device in learners.items()]
        learner, reason = pick(timings, rounds, cpu_threads)
        answer = {"learner": learner, "reason": reason, "rounds": rounds,
                  "measured_num_leaves": key.leaves, "timings": [asdict(t) for t in timings]}
        self._answers.append((key, answer))
        return answer, True


def _between(key: Picture, below: tuple[Picture, dict[str, Any]],
             above: tuple[Picture, dict[str, Any]], rounds: int,
             cpu_threads: int) -> dict[str, Any]:
    """The answer for a tree size between two measured ones: each learner's seconds per round
    and overhead interpolated in log(num_leaves) (a round's cost grows with the tree, and the
    learners' costs grow at different rates: on 1M rows CUDA was 5.7x the CPU's speed at 8
    leaves and half of it at 226, docs/GPU.md), then :func:`pick`. Taking the nearer picture's
    answer instead gave a CPU answer measured at 166 leaves to trees of 76 (docs/QUALITY.md,
    workload b, seventh session)."""
    (low, low_answer), (high, high_answer) = below, above
    share = math.log(key.leaves / low.leaves) / math.log(high.leaves / low.leaves)
    high_timings = {t["learner"]: t for t in high_answer["timings"]}
    timings = []
    for measured in low_answer["timings"]:
        other = high_timings.get(measured["learner"], {})
        figures = [measured.get(f) for f in ("s_per_round", "overhead_s")]
        others = [other.get(f) for f in ("s_per_round", "overhead_s")]
        if None in figures or None in others:  # a learner that failed at either end
            timings.append(Timing(measured["learner"],
                                  error=measured.get("error") or other.get("error") or "failed"))
            continue
        per_round = _log_interpolate(figures[0], others[0], share)
        overhead = figures[1] + share * (others[1] - figures[1])
        timings.append(Timing(measured["learner"], s_per_round=per_round, overhead_s=overhead))
    learner, reason = pick(timings, rounds, cpu_threads)
    return {"learner": learner,
            "reason": f"{reason} (between {low.leaves} and {high.leaves} leaves measured)",
            "rounds": rounds, "measured_num_leaves": [low.leaves, high.leaves],
            "timings": [asdict(t) for t in timings]}


def _log_interpolate(low: float, high: float, share: float) -> float:
    if low <= 0 or high <= 0:
        return low + share * (high - low)
    return math.exp(math.log(low) + share * (math.log(high) - math.log(low)))
