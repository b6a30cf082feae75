"""The environment a trial's child process is born with: written by the orchestrator
(hpo_orchestrator.scheduler._process), read by the child (``runtime.slot_info``, the worker
bootstrap). The one place that knows the ``HPO_*`` names (docs/DESIGN.md §2.5).

The environment is fixed before the child's interpreter starts, so CUDA, OpenMP and BLAS
read their settings at their first import and the child never sees another GPU. In reuse
mode one process runs many trials: only the per-trial names (trial number, attempt, threads)
change, through :func:`begin_trial`; a library that read its thread count at import keeps it,
which is why the objectives pass ``slot_info().num_threads`` to LightGBM and torch per trial.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

__all__ = ["IMPORT_FIRST", "SLOT", "ChildEnv", "begin_trial"]

TRIAL_NUMBER = "HPO_TRIAL_NUMBER"
ATTEMPT = "HPO_ATTEMPT"
SLOT = "HPO_SLOT"
GPU_INDEX = "HPO_GPU_INDEX"
GPU_UUID = "HPO_GPU_UUID"
NUM_THREADS = "HPO_NUM_THREADS"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# Modules the child imports before anything else (comma-separated; the worker bootstrap,
# hpo_orchestrator/worker/__main__.py). A user may set it for a custom objective too.
IMPORT_FIRST = "HPO_IMPORT_FIRST"


@dataclass(frozen=True)
class ChildEnv:
    """What a child is pinned to. Outside an orchestrated child (plain Optuna, a notebook)
    :meth:`parse` gives ``None`` for everything the orchestrator did not set."""

    trial_number: int | None
    attempt: int  # 2 and up: a retry of a trial that ran out of memory, was killed or lost
    slot: int | None
    gpu_index: int | None  # NVML index; None on a CPU slot
    gpu_uuid: str | None
    cuda_visible_devices: str | None  # exactly what the child got (hpo.cuda_visible_devices)
    num_threads: int | None
    import_first: tuple[str, ...] = ()  # see IMPORT_FIRST

    def render(self) -> dict[str, str]:
        """The variables to set in the child, on top of the orchestrator's own environment."""
        threads = "" if self.num_threads is None else str(self.num_threads)
        return {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # indices as NVML numbers them
            CUDA_VISIBLE_DEVICES: self.cuda_visible_devices or "",
            TRIAL_NUMBER: _text(self.trial_number),
            SLOT: _text(self.slot),
            GPU_INDEX: _text(self.gpu_index),
            GPU_UUID: self.gpu_uuid or "",
            NUM_THREADS: threads,
            ATTEMPT: str(self.attempt),
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",  # a native crash's last words reach the log
            **({IMPORT_FIRST: ",".join(self.import_first)} if self.import_first else {}),
        }

    @classmethod
    def parse(cls, environ: Mapping[str, str]) -> ChildEnv:
        return cls(
            trial_number=_int(environ.get(TRIAL_NUMBER)),
            attempt=_int(environ.get(ATTEMPT)) or 1,
            slot=_int(environ.get(SLOT)),
            gpu_index=_int(environ.get(GPU_INDEX)),
            gpu_uuid=environ.get(GPU_UUID) or None,
            cuda_visible_devices=environ.get(CUDA_VISIBLE_DEVICES),
            num_threads=_int(environ.get(NUM_THREADS)),
            import_first=tuple(filter(None, environ.get(IMPORT_FIRST, "").split(","))),
        )


def begin_trial(number: int, attempt: int, num_threads: int | None = None,
                environ: MutableMapping[str, str] = os.environ) -> None:
    """A reused process starts its next trial: the per-trial names follow it."""
    environ[TRIAL_NUMBER] = str(number)
    environ[ATTEMPT] = str(attempt)
    if num_threads is not None:  # trials_per_gpu=auto re-divides the cores as levels change
        for name in (NUM_THREADS, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            environ[name] = str(num_threads)


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _int(value: str | None) -> int | None:
    return int(value) if value else None
