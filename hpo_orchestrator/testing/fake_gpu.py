"""A scripted GPU backend for machines without GPUs.

Selected by ``HPO_ORCHESTRATOR_FAKE_GPUS``, either a count (``"2"``) or JSON::

    {"gpus": [{"busy_util": 90}, {"busy_util": 0, "memory_total_mib": 16000}]}

A fake GPU "runs" the processes that were pinned to it: any process whose environment has
``CUDA_VISIBLE_DEVICES`` equal to the GPU's index. While one runs, the GPU reports
``busy_util`` % utilization; ``busy_util: 0`` scripts a GPU that is asked for but never used
(the process never shows up on it, as with LightGBM training on a CPU OpenCL platform).

Phases: when ``HPO_FAKE_GPU_WORK_DIR`` is set, a pinned process works on its GPU only while
the file ``$HPO_FAKE_GPU_WORK_DIR/<pid>`` exists (the test objective ``phased`` creates it
for its ``train`` phase), so a data-loading phase reads 0 %, as on real hardware.

Foreign work: a process started with ``HPO_FAKE_FOREIGN_GPU=<index>`` in its environment
(and no ``HPO_TRIAL_NUMBER``) uses ``foreign_mem_mib`` and 100 % of that GPU while it lives,
like someone else's job on a shared machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import psutil

from hpo_orchestrator.gpu._base import GpuInfo, GpuSample

__all__ = ["FAKE_FOREIGN_ENV", "FAKE_WORK_DIR_ENV", "FakeGpu", "FakeGpuBackend"]

FAKE_WORK_DIR_ENV = "HPO_FAKE_GPU_WORK_DIR"
FAKE_FOREIGN_ENV = "HPO_FAKE_FOREIGN_GPU"


@dataclass(frozen=True)
class FakeGpu:
    busy_util: float = 90.0
    memory_total_mib: float = 81_559.0
    busy_mem_mib: float = 1_024.0
    busy_power_w: float = 300.0
    idle_power_w: float = 70.0
    foreign_mem_mib: float = 8_000.0


class FakeGpuBackend:
    name = "fake"
    unavailable_reason: str | None = None

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self._fakes = gpus

    @classmethod
    def from_spec(cls, spec: str) -> FakeGpuBackend:
        spec = spec.strip()
        if spec.isdigit():
            return cls([FakeGpu() for _ in range(int(spec))])
        data = json.loads(spec)
        return cls([FakeGpu(**entry) for entry in data["gpus"]])

    def gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(index=i, uuid=f"GPU-fake-{i:04d}", name="Fake GPU",
                    memory_total_mib=fake.memory_total_mib)
            for i, fake in enumerate(self._fakes)
        ]

    def _processes(self, index: int) -> tuple[list[int], list[int]]:
        """(our trial processes pinned to fake GPU ``index``, foreign processes on it)."""
        ours, foreign = [], []
        for proc in psutil.process_iter(["pid"]):
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("CUDA_VISIBLE_DEVICES") == str(index) and "HPO_TRIAL_NUMBER" in env:
                ours.append(proc.pid)
            elif env.get(FAKE_FOREIGN_ENV) == str(index) and "HPO_TRIAL_NUMBER" not in env:
                foreign.append(proc.pid)
        return ours, foreign

    def sample(self, index: int) -> GpuSample | None:
        if not 0 <= index < len(self._fakes):
            return None
        fake = self._fakes[index]
        ours, foreign = self._processes(index)
        pids = ours if fake.busy_util > 0 else []
        work_dir = os.environ.get(FAKE_WORK_DIR_ENV)
        working = [pid for pid in pids
                   if not work_dir or os.path.exists(os.path.join(work_dir, str(pid)))]
        busy = bool(working) or bool(foreign)
        processes: dict[int, tuple[float | None, float | None]] = {
            pid: (fake.busy_util if pid in working else 0.0, fake.busy_mem_mib) for pid in pids}
        processes.update({pid: (100.0, fake.foreign_mem_mib) for pid in foreign})
        return GpuSample(
            index=index,
            sm_util=100.0 if foreign else (fake.busy_util if busy else 0.0),
            mem_used_mib=fake.busy_mem_mib * len(pids) + fake.foreign_mem_mib * len(foreign),
            power_w=fake.busy_power_w if busy else fake.idle_power_w,
            temp_c=60.0 if busy else 35.0,
            processes=processes,
        )

    def close(self) -> None:
        pass
