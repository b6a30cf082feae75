"""Rendering a StatusReport for a terminal (rich) or as JSON."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from hpo_orchestrator.status._queries import StatusReport

__all__ = ["render_status"]


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_status(report: StatusReport) -> Group:
    parts: list[object] = []
    done = sum(report.states[s].count for s in ("COMPLETE", "PRUNED", "FAIL"))
    target = f" of {report.n_trials_target}" if report.n_trials_target else ""
    prune = "-" if report.prune_rate is None else f"{report.prune_rate:.0%}"
    parts.append(Text.assemble(
        ("study ", "bold"), (report.study, "bold cyan"),
        f"  ({report.direction})  finished {done}{target}  prune rate {prune}"))

    states = Table(title="trials by state", title_justify="left")
    for column in ("state", "count", "mean s", "median s", "max s"):
        states.add_column(column, justify="left" if column == "state" else "right")
    for name, stats in report.states.items():
        if stats.count:
            states.add_row(name, str(stats.count), _secs(stats.mean_s), _secs(stats.median_s),
                           _secs(stats.max_s))
    parts.append(states)

    if report.per_gpu:
        devices = Table(title="per device", title_justify="left")
        for column in ("device", "trials", "complete", "pruned", "failed", "running"):
            devices.add_column(column, justify="left" if column == "device" else "right")
        for entry in report.per_gpu:
            devices.add_row(entry["device"], str(entry["trials"]), str(entry["COMPLETE"]),
                            str(entry["PRUNED"]), str(entry["FAIL"]), str(entry["RUNNING"]))
        parts.append(devices)

    if report.running:
        running = Table(title="running", title_justify="left")
        for column in ("trial", "device", "elapsed s", "last step"):
            running.add_column(column, justify="left" if column == "device" else "right")
        for entry in report.running:
            running.add_row(str(entry["number"]), entry["device"], _secs(entry["elapsed_s"]),
                            "-" if entry["last_step"] is None else str(entry["last_step"]))
        parts.append(running)

    if report.fail_reasons:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(report.fail_reasons.items()))
        parts.append(Text(f"failures by reason: {reasons}", style="yellow"))
    if report.best:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in report.best["params"].items())
        parts.append(Text.assemble(("best ", "bold"),
                                   f"trial {report.best['number']}: {report.best['value']:.6g}",
                                   f"  ({params})"))
    return Group(*parts)  # type: ignore[arg-type]


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_status(report: StatusReport, console: Console) -> None:
    console.print(render_status(report))
