"""The checks every config dataclass uses: one ConfigError naming the key, with a hint."""

from __future__ import annotations

import os
from typing import Any

from hpo_orchestrator.errors import ConfigError

__all__ = ["MIN_TRIAL_MIB", "_positive_int", "_require", "_within_host", "host_trial_bound"]


def _require(ok: bool, key: str, message: str, hint: str | None = None) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}", hint or
                          f"set {key}=... on the command line; 'hpo-orchestrator run "
                          f"--show-config' prints the resolved configuration")


def _positive_int(value: Any, key: str, minimum: int = 1) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             key, f"expected an integer >= {minimum}, got {value!r}")


MIN_TRIAL_MIB = 20  # the least a trial's process holds (a Python interpreter and its imports)


def host_trial_bound() -> tuple[int, str]:
    """The most trial processes this host can hold at once, and why: one per 20 MiB of its
    memory, within the processes this user may start (RLIMIT_NPROC)."""
    import resource

    try:
        with open("/proc/meminfo", "rb") as meminfo:
            total_kib = next(int(line.split()[1]) for line in meminfo
                             if line.startswith(b"MemTotal:"))
    except (OSError, StopIteration, ValueError):
        total_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    bound = max(1, total_kib // (MIN_TRIAL_MIB * 1024))
    why = (f"a trial is a process of at least {MIN_TRIAL_MIB} MiB, and this host has "
           f"{total_kib / 2**20:.0f} GiB of memory")
    soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and soft < bound:
        bound, why = soft, f"this user may start {soft} processes (ulimit -u)"
    return bound, why


def _within_host(value: Any, key: str) -> None:
    """A count of trial processes (or places for them) the host can hold: a bigger one
    reserved memory for slots no trial could ever take (about 90 MB/s, no trial started)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return
    bound, why = host_trial_bound()
    _require(value <= bound, key, f"{value} is more than this host can run at once: at most "
             f"{bound} ({why})", f"set {key}={bound} or fewer")
