"""The GPUs this process was given: an inherited ``CUDA_VISIBLE_DEVICES`` is the universe.

Slurm, container runtimes and Kubernetes device plugins hand a process a subset of a host's
GPUs through ``CUDA_VISIBLE_DEVICES``. NVML ignores that variable and numbers every GPU of the
host its own way, so each entry is mapped to an NVML device here, by UUID where the entry is
one, and by CUDA's enumeration order where it is an index:

- ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: CUDA numbers GPUs by PCI bus id (CUDA Programming Guide,
  "CUDA Environment Variables").
- otherwise (``FASTEST_FIRST``, CUDA's default): fastest first, ties broken by PCI bus id. On
  a host of identical GPUs that is PCI order again; on a mixed host only CUDA knows the order,
  so an index there is refused (the hint asks for PCI_BUS_ID or UUIDs).

Only the devices this process can open count (under a device cgroup, as Slurm's
``ConstrainDevices`` sets up, CUDA numbers the allowed GPUs from 0, and NVML cannot open the
others). MIG instances (``MIG-...``) are refused: a slot is a whole GPU here.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu._base import GpuBackend, GpuInfo, GpuSample

__all__ = ["VISIBLE_ENV", "AllocatedBackend", "allocate", "cuda_order", "parse_visible_devices"]

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
ORDER_ENV = "CUDA_DEVICE_ORDER"
_NO_GPU_VALUES = ("", "NoDevFiles")  # Slurm writes NoDevFiles for a job without GPU files
_LIST_HINT = "'nvidia-smi -L' (or 'hpo-orchestrator gpus') lists this host's GPUs and UUIDs"


def cuda_order(backend: GpuBackend, device_order: str | None) -> list[GpuInfo] | None:
    """The backend's GPUs as CUDA numbers them under ``device_order``; None if only CUDA knows."""
    if (device_order or "").strip().upper() == "PCI_BUS_ID":
        gpus = backend.gpus()
        if all(g.pci_bus_id for g in gpus):
            return sorted(gpus, key=lambda g: str(g.pci_bus_id).lower())
        return gpus  # NVML enumerates by PCI bus id too
    return backend.fastest_first()


def parse_visible_devices(value: str, found: list[GpuInfo],
                          ordered: list[GpuInfo] | None) -> list[GpuInfo]:
    """The GPUs a ``CUDA_VISIBLE_DEVICES`` value names, in its order.

    Entries are indices into ``ordered`` (CUDA's numbering; None when it cannot be known),
    ``GPU-`` UUIDs or unique prefixes of them (as CUDA accepts). CUDA silently stops at the
    first entry it cannot use; here any such entry is a ConfigError naming it, because a
    silently smaller allocation is the bug this module exists to prevent.
    """
    text = value.strip()
    if text in _NO_GPU_VALUES:
        return []
    shown = f"{VISIBLE_ENV}={value}"
    chosen: list[GpuInfo] = []
    for raw in text.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise ConfigError(f"{shown}: {entry} is a MIG instance, and MIG is not supported "
                              "(a slot is a whole GPU)",
                              "give this process whole GPUs (indices or GPU- UUIDs); " + _LIST_HINT)
        if entry.isdigit():
            if ordered is None:
                raise ConfigError(
                    f"{shown}: index {entry} is ambiguous: this host's GPUs differ, and CUDA "
                    "numbers them fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID",
                    "set CUDA_DEVICE_ORDER=PCI_BUS_ID, or give GPU UUIDs; " + _LIST_HINT)
            if int(entry) >= len(ordered):
                raise ConfigError(f"{shown}: GPU {entry} does not exist (this process can use "
                                  f"{len(ordered)} GPU(s), numbered from 0)",
                                  "unset it, or name GPUs that exist; " + _LIST_HINT)
            gpu = ordered[int(entry)]
        elif entry.upper().startswith("GPU-"):
            matches = [g for g in found if g.uuid.lower().startswith(entry.lower())]
            if not matches:
                raise ConfigError(f"{shown}: GPU {entry} does not exist on this host",
                                  "unset it, or name GPUs that exist; " + _LIST_HINT)
            if len(matches) > 1:
                raise ConfigError(f"{shown}: {entry} is the start of {len(matches)} GPUs' UUIDs",
                                  "give a longer prefix or the whole UUID; " + _LIST_HINT)
            gpu = matches[0]
        else:
            raise ConfigError(f"{shown}: {entry!r} is neither a GPU index nor a GPU- UUID",
                              "e.g. CUDA_VISIBLE_DEVICES=0,1 or CUDA_VISIBLE_DEVICES=GPU-5c3e...")
        if gpu in chosen:
            raise ConfigError(f"{shown}: GPU {entry} is named twice", "name each GPU once")
        chosen.append(gpu)
    return chosen


class AllocatedBackend:
    """A backend that knows only the GPUs of this process's allocation.

    Everything downstream (slots, leases, busy-GPU checks, telemetry, ``hpo.devices.<host>``)
    asks ``gpus()`` and so never sees another GPU; ``all_gpus()`` is for ``hpo-orchestrator
    gpus``, which lists the others as not allocated. Thread safety and lifetime: the inner
    backend's.
    """

    def __init__(self, inner: GpuBackend, allocated: list[GpuInfo], source: str | None) -> None:
        self.inner = inner
        self.name = inner.name
        self.source = source  # the inherited CUDA_VISIBLE_DEVICES; None when it was unset
        self._allocated = sorted(allocated, key=lambda g: g.index)
        self._indices = {g.index for g in allocated}
        self.unavailable_reason: str | None = inner.unavailable_reason
        if inner.gpus() and not allocated:
            self.unavailable_reason = f"{VISIBLE_ENV}={source!r} gives this process no GPU"

    @property
    def restricted(self) -> bool:
        return self.source is not None

    def describe(self) -> str:
        """The allocation in words, for messages: the variable and the NVML indices it names."""
        indices = ", ".join(str(g.index) for g in self._allocated) or "none"
        if self.source is None:
            return f"all GPUs of this host (NVML {indices})"
        return f"{VISIBLE_ENV}={self.source} (NVML GPUs {indices})"

    def gpus(self) -> list[GpuInfo]:
        return list(self._allocated)

    def all_gpus(self) -> list[GpuInfo]:
        return self.inner.gpus()

    def fastest_first(self) -> list[GpuInfo] | None:
        order = self.inner.fastest_first()
        return None if order is None else [g for g in order if g.index in self._indices]

    def sample(self, index: int) -> GpuSample | None:
        return self.inner.sample(index) if index in self._indices else None

    def sample_any(self, index: int) -> GpuSample | None:
        """A reading of any GPU of the host (``gpus`` shows the unallocated ones too)."""
        return self.inner.sample(index)

    def close(self) -> None:
        self.inner.close()


def allocate(backend: GpuBackend, environ: Mapping[str, str]) -> AllocatedBackend:
    """Restrict ``backend`` to the inherited ``CUDA_VISIBLE_DEVICES`` (all GPUs when unset).

    Raises ConfigError for an entry that names no GPU of this host. A machine where no GPU is
    found at all ignores the variable: CPU slots run, as they would without it.
    """
    source = environ.get(VISIBLE_ENV)
    found = backend.gpus()
    if source is None or not found:
        return AllocatedBackend(backend, found, source if found else None)
    ordered = cuda_order(backend, environ.get(ORDER_ENV))
    return AllocatedBackend(backend, parse_visible_devices(source, found, ordered), source)
