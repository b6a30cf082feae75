"""Slots: the places a trial can run (GPU x trials_per_gpu, or CPU slots)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import AllocatedBackend, GpuBackend, GpuInfo
from hpo_orchestrator.placement._leases import Lease, LeaseDir, describe_holder
from hpo_orchestrator.placement._settings import Places, host_cores, places

__all__ = ["BusyRule", "Slot", "SlotPool", "resolve_gpus"]


@dataclass(frozen=True)
class Slot:
    id: int
    gpu: GpuInfo | None  # None: a CPU slot
    k: int = 0  # which of the GPU's trials_per_gpu places (its lease file)

    @property
    def cuda_visible_devices(self) -> str:
        """What the child's CUDA_VISIBLE_DEVICES is set to: the GPU's UUID, or empty.

        A UUID names one GPU whatever the numbering: CUDA's own order (FASTEST_FIRST unless
        CUDA_DEVICE_ORDER says otherwise), NVML's, or the renumbering from 0 inside a device
        cgroup (Slurm's ConstrainDevices) would each turn an index into another GPU. The CUDA
        driver reads the variable (CUDA Programming Guide, "CUDA Environment Variables":
        "GPU-<UUID>" entries), so the runtime (torch) and NVIDIA's OpenCL, built on the driver,
        see the same single GPU; NVML ignores it and lists processes by NVML index.
        """
        return self.gpu.uuid if self.gpu is not None else ""

    @property
    def gpu_index(self) -> int | None:
        """The NVML index of the slot's GPU; None on a CPU slot."""
        return self.gpu.index if self.gpu is not None else None

    @property
    def label(self) -> str:
        return f"gpu{self.gpu.index}" if self.gpu is not None else f"cpu{self.id}"


def resolve_gpus(wanted: Any, backend: GpuBackend) -> list[GpuInfo]:
    """The GPUs to schedule on, from ``scheduler.gpus`` (auto, none, or NVML indices), within
    the backend's GPUs (the allocation, with an AllocatedBackend)."""
    found = backend.gpus()
    if wanted == "none":
        return []
    if wanted == "auto":
        return found
    by_index = {gpu.index: gpu for gpu in found}
    for index in wanted:
        if index not in by_index and isinstance(backend, AllocatedBackend) and backend.restricted:
            raise ConfigError(f"scheduler.gpus: GPU {index} is outside this process's allocation, "
                              f"{backend.describe()}",
                              "use scheduler.gpus=auto, or NVML indices from the allocation")
        if index not in by_index:
            have = ", ".join(str(i) for i in by_index) or "none"
            reason = f" ({backend.unavailable_reason})" if backend.unavailable_reason else ""
            raise ConfigError(f"scheduler.gpus: GPU {index} does not exist on this host{reason}",
                              f"GPUs found: {have}; use scheduler.gpus=auto or a subset")
    return [by_index[i] for i in dict.fromkeys(wanted)]


BLOCKED_RECHECK_S = 5.0  # how often a GPU's lease holders are read while the run waits for it


@dataclass(frozen=True)
class BusyRule:
    """When a GPU counts as busy with someone else's work (then it is skipped for now)."""

    mem_mib: float = 2048.0
    util: float = 50.0
    recheck_s: float = 5.0


class SlotPool:
    """Free and busy slots of this orchestrator.

    Not thread safe: only the orchestrator's loop uses it. A trial holds its slot from spawn
    until its process has exited and its result is written. With a lease directory, a GPU
    slot is also leased host-wide (see _leases.py), so orchestrators of other studies on this
    host never push a GPU past trials_per_gpu. With a backend and a BusyRule, a GPU that no
    trial of ours (any orchestrator's) holds but that is busy anyway (a foreign process) is
    skipped, and looked at again after ``recheck_s``.

    Each GPU has a level (``limits``): trials of ours at once on it. Fixed, it is
    trials_per_gpu; with ``auto`` (scheduler.trials_per_gpu=auto, or parallel=auto alone) it
    starts at 1 and the packer moves it (:meth:`set_limit`) within ``max_per_gpu`` slots per
    GPU. ``parallel="auto"``: every GPU at its level (no further cap); on CPU slots, one trial
    per core. ``cpu_slots``: CPU slots beside the GPU slots (numbered after them, no level,
    no lease), counted in the concurrency.
    """

    def __init__(self, places: Places, leases: LeaseDir | None = None,
                 backend: GpuBackend | None = None, busy: BusyRule | None = None) -> None:
        gpus = list(places.gpus)
        self.auto = places.auto
        self.per_gpu = places.per_gpu
        self.slots = [Slot(id=i, gpu=gpu, k=k) for i, (k, gpu) in
                      enumerate((k, gpu) for k in range(self.per_gpu) for gpu in gpus)]
        self.limits = {gpu.index: places.start_level for gpu in gpus}
        # CPU slots beside the GPU slots (scheduler.cpu_slots: no level, no lease, numbered
        # last), or every slot of a host without GPUs
        self.cpu_places = places.cpu_slots if gpus else 0
        self.slots += [Slot(id=len(self.slots) + i, gpu=None) for i in range(places.cpu_slots)]
        self.cap = places.cap if places.cap is not None else len(self.slots)
        self._busy: set[int] = set()
        self._leases = leases if gpus else None
        self._held: dict[int, Lease] = {}
        self._backend = backend
        self._rule = busy
        self.skipped: dict[int, str] = {}  # GPU index -> why it is skipped now
        self._checked_at: dict[int, float] = {}
        # what the user is told (take_notes): a GPU skipped as busy, then free again; said
        # once per change, since the run's only other sign was an idle_gpu finding at the end
        self._notes: list[str] = []
        self._said_skipped: set[int] = set()
        self._said_blocked: dict[str, frozenset[object]] = {}  # GPU uuid -> who, when said
        self._said_refused: set[str] = set()
        self._blocked_checked: dict[str, float] = {}

    @classmethod
    def of(cls, gpus: list[GpuInfo], parallel: int | str, trials_per_gpu: int | str | None,
           leases: LeaseDir | None = None, backend: GpuBackend | None = None,
           busy: BusyRule | None = None, max_per_gpu: int = 4, cores: int | None = None,
           cpu_slots: int = 0) -> SlotPool:
        """The pool of ``parallel`` (as resolve_parallel made it) and ``trials_per_gpu``,
        without a run's settings (tests, benchmarks)."""
        return cls(places(gpus, parallel, trials_per_gpu, max_per_gpu, host_cores(cores), cpu_slots),
                   leases, backend, busy)

    @property
    def concurrency(self) -> int:
        """Trials at once now: the GPUs' levels (or the CPU slots), within scheduler.parallel."""
        places = sum(self.limits.values()) + self.cpu_places if self.limits else len(self.slots)
        return min(self.cap, places)

    def set_limit(self, gpu_index: int, limit: int) -> None:
        """The GPU's level from now on (running trials above it finish; none starts there)."""
        self.limits[gpu_index] = max(1, min(limit, self.per_gpu))

    def busy_on(self, gpu_index: int) -> int:
        return sum(1 for s in self.slots if s.id in self._busy and s.gpu and s.gpu.index == gpu_index)

    def has_free(self) -> bool:
        return len(self._busy) < self.concurrency

    def acquire(self, free_mib: dict[int, float] | None = None) -> Slot | None:
        """A free slot on the least-loaded GPU (lowest index first), or None when full.

        With ``free_mib`` (GPU index -> free memory), the GPU with the most free memory wins
        first: that is where a trial that ran out of memory is retried.
        """
        if len(self._busy) >= self.concurrency:
            return None
        load: dict[int | None, int] = {}
        for slot in self.slots:
            if slot.id in self._busy:
                load[slot.gpu_index] = load.get(slot.gpu_index, 0) + 1

        def rank(s: Slot) -> tuple[float, int, bool, int]:
            index = s.gpu_index
            memory = -free_mib.get(index, 0.0) if free_mib and index is not None else 0.0
            # then spread over GPUs; then a slot whose lease we kept (its reuse worker waits)
            return memory, load.get(index, 0), s.id not in self._held, s.id

        wanted: set[str] = set()  # GPUs whose slots other orchestrators of this host hold
        yielding: dict[str, bool] = {}  # per GPU: a look at the lease folder (about 50 us)
        for slot in sorted((s for s in self.slots if s.id not in self._busy), key=rank):
            if slot.gpu is not None and load.get(slot.gpu.index, 0) >= self.limits[slot.gpu.index]:
                continue  # the GPU runs as many trials as its level allows
            if slot.gpu is not None and self._foreign_busy(slot.gpu, load.get(slot.gpu.index, 0)):
                continue
            if self._leases is not None and slot.gpu is not None:
                if slot.gpu.uuid not in yielding:
                    yielding[slot.gpu.uuid] = self.yields(slot)
                if yielding[slot.gpu.uuid]:
                    wanted.add(slot.gpu.uuid)
                    continue  # its turn: another orchestrator has waited for the GPU longer
                if not self._lease(slot):
                    wanted.add(slot.gpu.uuid)
                    continue  # another orchestrator on this host runs a trial there
            self._busy.add(slot.id)
            self.stop_waiting()
            return slot
        if self._leases is not None:
            for uuid in wanted:
                self._leases.wait_for(uuid)
                self._note_blocked(uuid)
        return None

    def hold(self, slot: Slot) -> bool:
        """Take the free slot's host-wide lease without starting a trial on it: a spare
        worker waits there (scheduler/_workers.py). False when another orchestrator of this
        host holds it or waits for its GPU."""
        return slot.id not in self._busy and not self.yields(slot) and self._lease(slot)

    def _lease(self, slot: Slot) -> bool:
        """The slot's host-wide lease, kept from before or taken now; False when another
        orchestrator of this host holds it. (CPU slots, or no lease folder: nothing to take.)"""
        if self._leases is None or slot.gpu is None or slot.id in self._held:
            return True
        try:
            lease = self._leases.try_acquire(slot.gpu.uuid, slot.k)
        except ConfigError as exc:  # the folder changed under the run: no lease from it
            if exc.message not in self._said_refused:
                self._said_refused.add(exc.message)
                self._notes.append(f"{exc.message}: no trial starts on a GPU until it is fixed "
                                   f"({exc.hint})")
            return False
        if lease is None:
            return False
        self._held[slot.id] = lease
        return True

    def yields(self, slot: Slot) -> bool:
        """Does another orchestrator of this host wait for the slot's GPU longer than we do?
        Then we take none of its slots, and an idle worker of ours there gives its lease up."""
        return self._leases is not None and slot.gpu is not None \
            and self._leases.waited_longer(slot.gpu.uuid)

    def stop_waiting(self) -> None:
        if self._leases is not None:
            self._leases.stop_waiting()

    def describe(self, slot: Slot, **holder: Any) -> None:
        lease = self._held.get(slot.id)
        if lease is not None:
            lease.describe(**holder)

    def release(self, slot: Slot, keep_lease: bool = False) -> None:
        """The slot is free here. ``keep_lease``: a reuse worker stays on it, so other
        orchestrators of this host must still count it as taken."""
        self._busy.discard(slot.id)
        if not keep_lease:
            self.drop_lease(slot.id)

    def drop_lease(self, slot_id: int) -> None:
        lease = self._held.pop(slot_id, None)
        if lease is not None:
            lease.release()

    @property
    def busy(self) -> int:
        return len(self._busy)

    def _foreign_busy(self, gpu: GpuInfo, ours_here: int) -> bool:
        """Is the GPU busy with work that is not ours? (cached for ``recheck_s``)."""
        if self._backend is None or self._rule is None:
            return False
        now = time.monotonic()
        if now - self._checked_at.get(gpu.index, -math.inf) < self._rule.recheck_s:
            return gpu.index in self.skipped
        self._checked_at[gpu.index] = now
        self.skipped.pop(gpu.index, None)
        # Readings cannot be told apart while a trial of ours (of any orchestrator on this
        # host) uses the GPU; then the leases' trials_per_gpu cap is what protects it.
        if ours_here or (self._leases is not None and self._leases.holders(gpu.uuid)):
            return False
        sample = self._backend.sample(gpu.index)
        if sample is None:
            return False
        if sample.mem_used_mib is not None and sample.mem_used_mib >= self._rule.mem_mib:
            self.skipped[gpu.index] = (f"{sample.mem_used_mib:.0f} MiB used by other processes "
                                       f"(scheduler.busy_gpu_mem_mib={self._rule.mem_mib:g})")
        elif sample.sm_util is not None and sample.sm_util >= self._rule.util:
            self.skipped[gpu.index] = (f"{sample.sm_util:.0f} % utilization by other processes "
                                       f"(scheduler.busy_gpu_util={self._rule.util:g})")
        self._note_change(gpu.index, self._rule.recheck_s)
        return gpu.index in self.skipped

    def _note_change(self, index: int, recheck_s: float) -> None:
        if index in self.skipped and index not in self._said_skipped:
            self._said_skipped.add(index)
            self._notes.append(
                f"gpu{index} skipped: {self.skipped[index]}; its trials go to the other slots, "
                f"and it is looked at again every {recheck_s:g} s "
                "(scheduler.avoid_busy_gpus=false uses it anyway)")
        elif index not in self.skipped and index in self._said_skipped:
            self._said_skipped.discard(index)
            self._notes.append(f"gpu{index} is no longer busy with other processes: trials start there again")

    def _note_blocked(self, uuid: str) -> None:
        """Say who keeps the run off a GPU (the kernel's uid and pid of each lease, or the
        waiter whose turn it is), once per GPU and set of holders: a run that waits says why."""
        assert self._leases is not None
        now = time.monotonic()
        if now - self._blocked_checked.get(uuid, -math.inf) < BLOCKED_RECHECK_S:
            return  # the holders are read (a flock on each file) every few seconds at most
        self._blocked_checked[uuid] = now
        gpu = next(s.gpu for s in self.slots if s.gpu is not None and s.gpu.uuid == uuid)
        if uuid in self._leases.turn_of:
            waiter = self._leases.turn_of[uuid]
            who: frozenset[object] = frozenset({("turn", waiter.get("uid"), waiter.get("pid"))})
            text = (f"gpu{gpu.index}: its turn goes to {describe_holder(waiter)}, which has "
                    "waited for it longer; trials start there when that one has had a slot")
        else:
            mine = {s.k for s in self.slots
                    if s.id in self._held and s.gpu is not None and s.gpu.uuid == uuid}
            held = {k: h for k, h in self._leases.holders(uuid).items()
                    if k < self.per_gpu and k not in mine}
            if not held:
                return
            who = frozenset((h.get("blocked"), h.get("uid"), h.get("pid"), h.get("file_uid"))
                            for h in held.values())
            each = "; ".join(f"slot {k}: {describe_holder(h)}" for k, h in sorted(held.items()))
            text = (f"gpu{gpu.index}: waiting for a slot held by another orchestrator of this "
                    f"host ({each}); trials start there when one is free "
                    "(`hpo-orchestrator gpus` lists the holders)")
        if self._said_blocked.get(uuid) != who:
            self._said_blocked[uuid] = who
            self._notes.append(text)

    def take_notes(self) -> list[str]:
        """What changed about the GPUs the run may use since the last call (for the user)."""
        notes, self._notes = self._notes, []
        return notes
