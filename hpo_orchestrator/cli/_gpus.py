"""``gpus``: this host's GPUs and which trial holds each slot lease."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rich.console import Console

__all__ = ["cmd_gpus"]


def cmd_gpus(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from hpo_orchestrator.gpu import open_backend
    from hpo_orchestrator.placement import LeaseDir, default_lease_dir, describe_holder, user_name

    backend = open_backend()
    leases = LeaseDir(default_lease_dir(args.lease_dir))
    rows: list[dict[str, Any]] = []
    allocated = {gpu.index for gpu in backend.gpus()}
    # GPUs outside this process's allocation are listed, but neither read nor offered
    for gpu in backend.all_gpus():
        sample = backend.sample(gpu.index)
        held = leases.holders(gpu.uuid) if gpu.index in allocated else {}
        rows.append({
            "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid,
            "allocated": gpu.index in allocated,
            "util": sample.sm_util if sample else None,
            "mem_used_mib": sample.mem_used_mib if sample else None,
            "mem_total_mib": gpu.memory_total_mib,
            "slots": [{"slot": k, **holder} for k, holder in sorted(held.items())]})
    backend.close()
    if args.json:
        print(json.dumps({"lease_dir": str(leases.path), "allocation": backend.describe(),
                          "cuda_visible_devices": backend.source, "gpus": rows,
                          "unavailable_reason": backend.unavailable_reason}, indent=2))
        return 0
    if not rows:
        console.print(f"no GPU: {backend.unavailable_reason or 'none found'}", highlight=False)
        return 0
    title = f"GPUs (slot leases in {leases.path})"
    owner = leases.owner()
    if owner not in (None, 0, os.geteuid()):
        # a shared folder another user made: they may remove leases in it (docs/HOSTS.md)
        title = f"GPUs (slot leases in {leases.path}, a folder of {user_name(owner)})"
    if backend.restricted:
        title += f"; this process may use {backend.describe()}"
    table = Table(title=title, title_justify="left")
    for column in ("gpu", "name", "util", "memory MiB", "held slots"):
        table.add_column(column)
    for row in rows:
        memory = "-" if row["mem_used_mib"] is None else (
            f"{row['mem_used_mib']:.0f} / {row['mem_total_mib']:.0f}" if row["mem_total_mib"]
            else f"{row['mem_used_mib']:.0f}")
        # who holds a slot as the kernel says (uid, pid of the lock); the holder's own note
        # (study, trial) only where no one else could have written it (placement/_leases.py)
        holders = "\n".join(f"{h['slot']}: {describe_holder(h)}" for h in row["slots"]) \
            or ("free" if row["allocated"] else "not allocated")
        table.add_row(str(row["index"]), row["name"], "-" if row["util"] is None else f"{row['util']:.0f}%",
                      memory, holders)
    console.print(table)
    return 0

