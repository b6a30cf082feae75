"""What placement reads of the run: plain numbers, through narrow read-only views.

The packer never holds the loop's objects (a trial's process, its pipe, its Optuna trial):
the loop hands it a :class:`RunningView` of each running trial, the telemetry sampler is read
through :class:`Readings`, and the study through :class:`StudyAttrs`. So every placement
decision is a function of numbers, and tests script them. A rule that needs another number
of the run (a trial's measured CPU use, its first steps' GPU memory) gets a field here or in
the observations of placement/_rules.py, filled where the loop or the sampler knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpo_orchestrator.telemetry import DeviceReading

__all__ = ["Readings", "RunningView", "StudyAttrs"]


@dataclass(frozen=True)
class RunningView:
    """A trial on a slot as placement sees it."""

    gpu: int | None  # NVML index of its GPU; None on a CPU slot
    worker: int  # its worker process's pid: a worker's first trial of a kind warms up
    started: float  # time.monotonic() of its spawn
    threads: int | None = None  # CPU threads it was given
    params: Mapping[str, Any] = field(default_factory=dict)  # suggested so far
    choices: Mapping[str, int] = field(default_factory=dict)  # categorical params: their choices
    reports: tuple[tuple[int, float], ...] = ()  # (step, seconds since its spawn)
    ended: bool = False  # its result is in; its slot not yet handed on


class Readings(Protocol):
    """What the telemetry sampler measured (telemetry/_sampler.py)."""

    def device_readings(self, gpu_index: int, since: float) -> list[DeviceReading]: ...

    def cpu_readings(self, since: float) -> list[float]: ...

    def running_mem_peaks(self, gpu_index: int) -> list[float]: ...


class StudyAttrs(Protocol):
    """The study's attrs, where the packer keeps hpo.packing.<host> (an ``optuna.Study``)."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...

    def set_user_attr(self, key: str, value: Any) -> None: ...
