"""A scripted GPU backend for machines without GPUs.

Selected by ``HPO_ORCHESTRATOR_FAKE_GPUS``, either a count (``"2"``) or JSON::

    {"gpus": [{"busy_util": 90}, {"busy_util": 0, "memory_total_mib": 16000}]}

Each fake GPU has a UUID that does not contain its index, and CUDA's default numbering of
the fakes differs from NVML's, as on a host of mixed GPUs: GPU i has speed i + 1 (and a name
that says so), so CUDA_DEVICE_ORDER=FASTEST_FIRST numbers them in reverse. A mapping that
confuses the two numberings, or an index with a UUID, therefore picks the wrong fake GPU.
``uuid``, ``name`` and ``speed`` may be scripted per GPU in the JSON spec.

A fake GPU "runs" the processes that were pinned to it: any trial process whose first visible
device (its ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` read as CUDA reads them) is
that GPU. While one runs, the GPU reports
``busy_util`` % utilization; ``busy_util: 0`` scripts a GPU that is asked for but never used
(the process never shows up on it, as with LightGBM training on a CPU OpenCL platform).

Phases: when ``HPO_FAKE_GPU_WORK_DIR`` is set, a pinned process works on its GPU only while
the file ``$HPO_FAKE_GPU_WORK_DIR/<pid>`` exists (the test objective ``phased`` creates it
for its ``train`` phase), so a data-loading phase reads 0 %, as on real hardware. A number
written in the file is that process's own SM % (trials sharing a GPU with different loads).

One machine: every process on this host is looked at, as NVML would; a test that must not
see the fake-GPU processes of other tests running at the same time on this host sets
``HPO_FAKE_GPU_MACHINE`` to a name of its own, and only processes with the same value count.

Foreign work: a process started with ``HPO_FAKE_FOREIGN_GPU=<index>`` in its environment
(and no ``HPO_TRIAL_NUMBER``) uses ``foreign_mem_mib`` and 100 % of that GPU while it lives,
like someone else's job on a shared machine.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import psutil

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu._allocation import ORDER_ENV, VISIBLE_ENV, cuda_order, parse_visible_devices
from hpo_orchestrator.gpu._base import GpuInfo, GpuSample

__all__ = ["FAKE_FOREIGN_ENV", "FAKE_MACHINE_ENV", "FAKE_WORK_DIR_ENV", "FakeGpu", "FakeGpuBackend",
           "fake_uuid"]

FAKE_WORK_DIR_ENV = "HPO_FAKE_GPU_WORK_DIR"
FAKE_FOREIGN_ENV = "HPO_FAKE_FOREIGN_GPU"
FAKE_MACHINE_ENV = "HPO_FAKE_GPU_MACHINE"


@dataclass(frozen=True)
class FakeGpu:
    busy_util: float = 90.0
    memory_total_mib: float = 81_559.0
    busy_mem_mib: float = 1_024.0
    busy_power_w: float = 300.0
    idle_power_w: float = 70.0
    foreign_mem_mib: float = 8_000.0
    uuid: str | None = None  # default: a UUID derived from the index (but not showing it)
    name: str | None = None
    speed: float | None = None  # CUDA's FASTEST_FIRST rank; default index + 1


def fake_uuid(index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, f'hpo-orchestrator-fake-gpu-{index}')}"


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

    def _speed(self, index: int) -> float:
        speed = self._fakes[index].speed
        return float(index + 1) if speed is None else speed

    def gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(index=i, uuid=fake.uuid or fake_uuid(i),
                    name=fake.name or f"Fake GPU (speed {self._speed(i):g})",
                    memory_total_mib=fake.memory_total_mib,
                    pci_bus_id=f"00000000:{0x10 + i:02X}:00.0")
            for i, fake in enumerate(self._fakes)
        ]

    def fastest_first(self) -> list[GpuInfo] | None:
        return sorted(self.gpus(), key=lambda g: (-self._speed(g.index), g.index))

    def device_of(self, env: dict[str, str]) -> int | None:
        """The NVML index of the GPU a process with this environment computes on (its CUDA
        device 0), or None when it sees none: what CUDA would make of the variables."""
        visible = env.get(VISIBLE_ENV)
        ordered = cuda_order(self, env.get(ORDER_ENV))
        if visible is None:
            return ordered[0].index if ordered else None
        try:
            chosen = parse_visible_devices(visible, self.gpus(), ordered)
        except ConfigError:
            return None  # CUDA would give it no device
        return chosen[0].index if chosen else None

    def _processes(self, index: int) -> tuple[list[int], list[int]]:
        """(our trial processes pinned to fake GPU ``index``, foreign processes on it)."""
        ours, foreign = [], []
        machine = os.environ.get(FAKE_MACHINE_ENV)
        for proc in psutil.process_iter(["pid"]):
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            if env.get(FAKE_MACHINE_ENV) != machine:
                continue
            if "HPO_TRIAL_NUMBER" in env and self.device_of(env) == index:
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
        scripted = {pid: _scripted_util(work_dir, pid, fake.busy_util) for pid in pids}
        working = {pid: util for pid, util in scripted.items() if util is not None}
        busy = bool(working) or bool(foreign)
        # As NVML: a listed process that ran no kernels since the last query has no sample.
        processes: dict[int, tuple[float | None, float | None]] = {
            pid: (working.get(pid), fake.busy_mem_mib) for pid in pids}
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


def _scripted_util(work_dir: str | None, pid: int, busy_util: float) -> float | None:
    """The process's SM % while it works (None: idle). Without a work folder it always works;
    with one, while its marker file exists, at the % written in the file if any."""
    if not work_dir:
        return busy_util
    try:
        with open(os.path.join(work_dir, str(pid))) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return float(text) if text else busy_util
