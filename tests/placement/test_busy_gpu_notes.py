"""A GPU skipped as busy with other processes' work is said while the run runs (the user's only
sign used to be an idle_gpu finding at the end), once when it is skipped and once when it is
free again; never for a GPU that was never skipped."""

from __future__ import annotations

from hpo_orchestrator.gpu._base import GpuInfo, GpuSample
from hpo_orchestrator.placement._slots import BusyRule, SlotPool

GPUS = [GpuInfo(0, "GPU-0", "H100"), GpuInfo(1, "GPU-1", "H100")]


class Readings:
    """A backend whose GPU 0 holds ``foreign_mib`` of another process's memory."""

    def __init__(self) -> None:
        self.foreign_mib = 0.0

    def sample(self, index: int) -> GpuSample:
        return GpuSample(index, 0.0, self.foreign_mib if index == 0 else 0.0, None, None)


def test_a_skipped_gpu_is_said_once_and_its_return_too() -> None:
    backend = Readings()
    backend.foreign_mib = 3000.0
    pool = SlotPool.of(GPUS, 2, 1, backend=backend, busy=BusyRule(recheck_s=0.0))  # type: ignore[arg-type]
    first = pool.acquire()
    assert first is not None and first.gpu is not None and first.gpu.index == 1
    assert pool.acquire() is None  # gpu0 is busy: no second slot
    notes = pool.take_notes()
    assert len(notes) == 1 and notes[0].startswith("gpu0 skipped: 3000 MiB used by other processes")
    assert "scheduler.avoid_busy_gpus=false" in notes[0]
    assert pool.acquire() is None and pool.take_notes() == []  # still busy: not said again
    backend.foreign_mib = 0.0
    second = pool.acquire()
    assert second is not None and second.gpu is not None and second.gpu.index == 0
    assert pool.take_notes() == ["gpu0 is no longer busy with other processes: trials start there again"]


def test_gpus_never_skipped_give_no_notes() -> None:
    pool = SlotPool.of(GPUS, 2, 1, backend=Readings(), busy=BusyRule(recheck_s=0.0))  # type: ignore[arg-type]
    assert pool.acquire() is not None and pool.acquire() is not None
    assert pool.take_notes() == []
