"""The host's cores shared with other orchestrators: said and recorded, not leased.

A GPU slot is leased host-wide (placement/_leases.py); a CPU slot is not, so two CPU-only
runs on one host each take one trial per core, and the host runs twice as many trials as
cores. So that this is never silent, a run whose trials run on CPU slots announces them in the
lease folder (:meth:`LeaseDir.announce_cores`): a file held with a flock for the run's length,
whose note names the CPUs of the run's affinity, its CPU trials at once and their threads. At
the run's start and every ``RECHECK_S`` it reads the other runs' (:meth:`LeaseDir.core_users`:
who each is, the kernel's pid and uid; what it uses, its note where the note cannot be
forged). When the cores they keep busy on this run's CPUs and this run's own trials' come to
more than those CPUs, the run says so once per set of runs (:meth:`CoreShare.take_notes`),
and again when they are gone, and keeps the latest such time in the study attr
``hpo.shared_cores.<host>`` (status's ``shared_cores`` finding).

Why it only says so (docs/HOSTS.md, "Several runs on one host's cores"): the kernel
time-slices cores, so trials that share them run slower and none fails, where two trials
over one GPU's memory fail; a lease would keep a second run at 0 trials until the first ends,
and would overrule a ``scheduler.parallel`` the user set on purpose. What a run keeps busy
is what it was given, not what it measured: a trial that is still importing uses no core
yet, and the note is needed before the trials start.

Trials on GPU slots are not counted, whatever they train on (their CPU use is known only once
they run); nor are runs that use another lease folder, or another PID namespace's.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hpo_orchestrator import keys
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.placement._leases import Lease, LeaseDir, user_name
from hpo_orchestrator.placement._view import StudyAttrs

__all__ = ["CoreShare", "CoreUser", "sharing"]

RECHECK_S = 5.0  # how often the other runs' presence is read (a listing and a flock each)


@dataclass(frozen=True)
class CoreUser:
    """Another run of this host that keeps some of this run's cores busy."""

    pid: int
    uid: int | None
    study: str
    trials: int  # its trials at once on CPU slots
    cores: int  # of this run's CPUs, how many its trials keep busy

    def describe(self) -> str:
        return f"pid {self.pid}, {user_name(self.uid)}, study {self.study!r}"

    def as_attr(self) -> dict[str, Any]:
        return {"pid": self.pid, "uid": self.uid, "user": user_name(self.uid),
                "study": self.study, "trials": self.trials, "cores": self.cores}


def wanted_cores(trials: int, threads: int, cpus: Collection[int]) -> int:
    """The cores ``trials`` at once of ``threads`` threads each keep busy on ``cpus``."""
    return min(trials * threads, len(cpus))


def sharing(cpus: Collection[int], wanted: int, others: list[dict[str, Any]]) -> list[CoreUser]:
    """The other runs whose trials share this run's cores (none where they all fit in
    ``cpus`` beside this run's ``wanted``): each keeps busy at most what it wants, and at most
    the CPUs it has in common with this run. A run's note that is not whole (not trusted, or
    of a shape this package never writes) counts as no run."""
    mine = set(cpus)
    users = [user for user in (_user(o, mine) for o in others) if user is not None and user.cores]
    if wanted + sum(u.cores for u in users) <= len(mine):
        return []
    return users


def _user(other: dict[str, Any], mine: set[int]) -> CoreUser | None:
    cpus = other.get("cpus")
    if not (isinstance(cpus, list) and all(_whole(c) for c in cpus)
            and all(_whole(other.get(k)) for k in ("trials", "wanted", "pid"))
            and isinstance(other.get("study"), str)):
        return None
    return CoreUser(pid=other["pid"], uid=other.get("uid"), study=other["study"],
                    trials=other["trials"], cores=min(other["wanted"], len(mine & set(cpus))))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def sharing_note(users: list[CoreUser], cpus: Collection[int], wanted: int, host_cpus: int) -> str:
    """What the user is told when other runs share this run's cores, and what to do."""
    cores = f"{len(cpus)} core{'s' if len(cpus) != 1 else ''}"
    where = f"this host's {cores}" if len(cpus) == host_cpus else f"the {cores} this run may use"
    used = sum(u.cores for u in users)
    if len(users) == 1:
        who = f"another hpo-orchestrator run ({users[0].describe()}) is using {used} of {where}"
    else:
        each = "; ".join(f"{u.describe()}: {u.cores}" for u in users)
        who = f"{len(users)} other hpo-orchestrator runs ({each}) are using {used} of {where}"
    return f"{who}, and this run's trials use {wanted}: trials will share cores and run " \
           f"slower; {own_cores_advice(len(cpus), len(users), len(cpus) - used)}"


def own_cores_advice(cpus: int, others: int, free: int) -> str:
    """How to give the runs cores of their own: this one to the free cores, or each run a
    share, or (fewer cores than runs) one after the other."""
    if free >= 1:
        return (f"run this one with scheduler.host_cores={free}, as many as are free, or wait "
                "for the other run to end")
    if cpus // (others + 1) >= 1:
        return (f"give each run its own: scheduler.host_cores={cpus // (others + 1)} in each, "
                "or wait for the other run to end")
    return "wait for the other run to end, or start it on other cores (taskset -c)"


class CoreShare:
    """This run's presence on the host's cores, and what it says of the other runs there.

    Inactive (announces and reads nothing) for a run without trials on CPU slots or without
    a lease folder. Not thread safe: the loop alone calls it, and the first wave announces."""

    def __init__(self, leases: LeaseDir | None, cpus: Collection[int], trials: int,
                 threads: int, study: str, host: str) -> None:
        self._leases = leases if trials > 0 else None
        self.cpus = sorted(cpus)
        self.trials, self.threads = trials, threads
        self.wanted = wanted_cores(trials, threads, self.cpus)
        self._study, self._host = study, host
        self._own: Lease | None = None
        self._checked_at = -math.inf
        self.users: list[CoreUser] = []  # the runs sharing this run's cores now
        self._said: frozenset[tuple[int, int | None]] = frozenset()
        self._notes: list[str] = []
        self._episode: dict[str, Any] | None = None  # the sharing of now, as recorded

    @property
    def active(self) -> bool:
        return self._leases is not None

    def announce(self) -> None:
        """Tell the other runs of this host which cores this run's trials use (once)."""
        if self._leases is None or self._own is not None:
            return
        try:
            self._own = self._leases.announce_cores(
                study=self._study, cpus=self.cpus, trials=self.trials, threads=self.threads,
                wanted=self.wanted)
        except ConfigError as exc:
            self._unusable(f"{exc.message} ({exc.hint})")
        except OSError as exc:
            self._unusable(f"lease folder {self._leases.path}: {exc.strerror or exc}")

    def _unusable(self, why: str) -> None:
        self._notes.append(f"{why}: this run cannot see other hpo-orchestrator runs on this "
                           "host's cores, nor they it")
        self._leases = None

    def check(self, now: float | None = None) -> bool:
        """Read the other runs (every RECHECK_S at most): True when the set of those sharing
        this run's cores changed (then :meth:`record` it)."""
        now = time.monotonic() if now is None else now
        if self._leases is None or now - self._checked_at < RECHECK_S:
            return False
        self._checked_at = now
        try:
            others = self._leases.core_users(self._own)
        except (ConfigError, OSError):
            return False  # the folder changed under the run: the next look tries again
        self.users = sharing(self.cpus, self.wanted, others)
        who = frozenset((u.pid, u.uid) for u in self.users)
        if who == self._said:
            return False
        if self.users:
            self._notes.append(sharing_note(self.users, self.cpus, self.wanted, _host_cpus()))
        else:
            self._notes.append("no other hpo-orchestrator run uses this run's cores any more: "
                               "its trials have them to themselves again")
        self._said = who
        return True

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    def record(self, study: StudyAttrs) -> None:
        """The sharing as it is now, into ``hpo.shared_cores.<host>``: a new time of sharing
        replaces an earlier one; each run seen in it stays listed until it ends."""
        stamp = _stamp()
        if self.users:
            if self._episode is None or self._episode["until"] is not None:
                self._episode = {"since": stamp, "until": None, "cores": len(self.cpus),
                                 "wanted": self.wanted, "trials": self.trials, "others": []}
            seen = {o["pid"]: o for o in self._episode["others"]}
            seen.update({u.pid: u.as_attr() for u in self.users})
            self._episode["others"] = sorted(seen.values(), key=lambda o: o["pid"])
        elif self._episode is not None and self._episode["until"] is None:
            self._episode["until"] = stamp
        else:
            return
        study.set_user_attr(keys.SHARED_CORES_PREFIX + self._host, self._episode)

    def finish(self, study: StudyAttrs) -> None:
        """The run ends: a sharing still going on ends with it."""
        if self._episode is not None and self._episode["until"] is None:
            self.users = []
            self.record(study)

    def close(self) -> None:
        """Withdraw this run's presence (safe to call twice)."""
        if self._own is not None and self._leases is not None:
            self._leases.withdraw(self._own)
        self._own = None


def _host_cpus() -> int:
    return os.cpu_count() or 1


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
