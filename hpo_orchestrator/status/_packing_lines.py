"""Words for what ``scheduler.trials_per_gpu=auto`` did (the hpo.packing.<host> attr), shared by
the terminal status, the report and the ``low_gpu_util`` finding."""

from __future__ import annotations

from typing import Any

__all__ = ["cpu_share", "device_choice_line", "packing_hold", "packing_lines", "packing_of_device"]

_SHOWN_CHANGES = 12  # the latest changes a terminal shows (--json and the attr keep them all)


def packing_lines(entry: dict[str, Any]) -> list[str]:
    """A heading, one line per GPU (its levels over time, where it stands and why), then the
    latest changes with their reasons. Fixed trials per GPU: nothing to say, unless MPS ran."""
    mps_on = bool((entry.get("mps") or {}).get("active"))
    mps = "CUDA MPS on" if mps_on else "CUDA MPS off"
    if entry.get("mode") != "auto":
        return [f"packing on {entry['host']}: fixed trials per GPU ({mps})"] if mps_on else []
    lines = [f"packing on {entry['host']}: trials per GPU measured (trials_per_gpu=auto, the "
             f"default; target {entry.get('target_gpu_util', '-')}% GPU utilization, at most "
             f"{entry.get('max_trials_per_gpu', '-')} per GPU; {mps})"]
    changes = entry.get("changes") or []
    for level in entry.get("levels") or []:
        path = [1] + [c["to"] for c in changes if c["gpu"] == level["gpu"]]
        held = f" (held: {level['held']})" if level.get("held") else ""
        lines.append(f"  gpu{level['gpu']} {' -> '.join(str(n) for n in path)}, now "
                     f"{level['limit']}{held}")
    for change in changes[-_SHOWN_CHANGES:]:
        lines.append(f"    {change['time']} gpu{change['gpu']} {change['from']} -> "
                     f"{change['to']}: {change['reason']}")
    return lines


def packing_of_device(packing: list[dict[str, Any]], host: str | None,
                      gpu_index: int) -> str | None:
    """What auto did on one GPU, in a sentence (for the low_gpu_util finding); None when the
    GPU was not run by trials_per_gpu=auto."""
    for entry in packing:
        if entry.get("mode") != "auto" or (host is not None and entry["host"] != host):
            continue
        for level in entry.get("levels") or []:
            if level["gpu"] == gpu_index:
                top = max([1] + [c["to"] for c in entry.get("changes") or []
                                 if c["gpu"] == gpu_index])
                held = f"; it went no higher: {level['held']}" if level.get("held") else ""
                ran = "one trial at a time" if top == 1 else f"up to {top} trials at once"
                return f"trials_per_gpu=auto ran {ran} on it (now {level['limit']}){held}"
    return None


def packing_hold(packing: list[dict[str, Any]], host: str | None, gpu_index: int) -> str | None:
    """What held one GPU at its level under trials_per_gpu=auto, in a word (the level's
    ``held_by``: placement/_rules.py HOLD_CAUSES); None when nothing held it, the GPU was not
    packed, or the entry predates the word."""
    for entry in packing:
        if entry.get("mode") != "auto" or (host is not None and entry["host"] != host):
            continue
        for level in entry.get("levels") or []:
            if level["gpu"] == gpu_index:
                return level.get("held_by") if level.get("held") else None
    return None


def device_choice_line(entry: dict[str, Any]) -> str:
    """objective.device=auto on a host, in a line (status, report and the low_gpu_util
    finding): its latest measurement, and where each GPU's trials trained."""
    learner = entry.get("learner")
    where = "the CPU" if learner == "cpu" else f"the GPU ({learner} learner)"
    line = (f"objective.device=auto on {entry.get('host')}: the latest measurement (trial "
            f"{entry.get('trial', '-')}) chose {where}: {entry.get('reason', '-')}")
    learners = entry.get("learners")
    if isinstance(learners, dict) and learners:
        trained = "; ".join(
            f"gpu{gpu} " + ", ".join(f"{n} on {'the CPU' if name == 'cpu' else name}"
                                     for name, n in sorted(counts.items()))
            for gpu, counts in sorted(learners.items(), key=lambda item: _gpu_order(item[0]))
            if isinstance(counts, dict))
        line += f"; trials trained: {trained}"
    return line


def cpu_share(entry: dict[str, Any] | None, gpu_index: int) -> float | None:
    """The share of a GPU's auto trials that trained on the CPU learner; from the latest
    measurement alone (1 or 0) where the entry predates the counts; None without an entry or
    without an auto trial on that GPU."""
    if entry is None:
        return None
    learners = entry.get("learners")
    if not learners:  # an entry from before the counts
        return 1.0 if entry.get("learner") == "cpu" else 0.0
    counts = learners.get(str(gpu_index)) or {}
    total = sum(counts.values())
    return counts.get("cpu", 0) / total if total else None  # no auto trial on this GPU


def _gpu_order(index: str) -> tuple[int, str]:
    """gpu2 before gpu10."""
    return (int(index), "") if index.isdigit() else (1 << 30, index)
