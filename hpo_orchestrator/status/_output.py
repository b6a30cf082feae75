"""Rendering a StatusReport for a terminal (rich). ``--json`` uses StatusReport.to_json."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from hpo_orchestrator.status._model import StatusReport
from hpo_orchestrator.status._packing_lines import device_choice_line, packing_lines
from hpo_orchestrator.status._tuning import pruner_tuning_lines

__all__ = ["print_status", "render_status"]


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None, fraction: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.0f}%" if fraction else f"{value:.0f}%"


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def _finished(report: StatusReport) -> str:
    """The trials that count against n_trials, as the run's budget counts them: a failed
    attempt whose params ran again (interrupted by Ctrl-C, retried after an OOM) is said
    apart, so the count never exceeds the budget because of a resume."""
    done = sum(report.states[s].count for s in ("COMPLETE", "PRUNED", "FAIL")) - report.retried \
        - report.never_ran
    target = f" of {report.n_trials_target}" if report.n_trials_target else ""
    if report.n_trials_target and done > report.n_trials_target:
        # trials told or added outside the runs (optuna tell, study.add_trial): never shown
        # as more than the budget
        extra = done - report.n_trials_target
        target += f" (+{extra} more, finished outside the runs)"
        done = report.n_trials_target
    again = f" (+{report.retried} attempt{'s' if report.retried != 1 else ''} re-run: " \
        "interrupted or retried)" if report.retried else ""
    return f"finished {done}{target}{again}"


def _wall(report: StatusReport) -> str:
    """Time with trials running; the span from the first start to the last end as well when
    it holds gaps (between a Ctrl-C and the resume) longer than a tenth of it."""
    if report.wall_s is None:
        return ""
    if report.active_s is None or report.wall_s - report.active_s <= max(1.0, 0.1 * report.wall_s):
        return f"  wall {report.wall_s:.0f} s"
    return f"  wall {report.active_s:.0f} s with trials running ({report.wall_s:.0f} s from the " \
        "first start, gaps between runs included)"


def render_status(report: StatusReport, typed: Callable[[str], str] = str) -> Group:
    """``typed``: the commands a finding's advice quotes, as the user types them (the CLI's
    as_typed: with the study and storage this status is about). The sections of
    ``_SECTIONS``, in order, each as much as the report has for it."""
    return Group(*(part for section in _SECTIONS for part in section(report, typed)))


def _heading(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    return [Text.assemble(
        ("study ", "bold"), (report.study, "bold cyan"),
        f"  ({', '.join(report.directions or [report.direction])})  {_finished(report)}  prune rate "
        f"{_pct(report.prune_rate, fraction=True)}{_wall(report)}")]


def _states(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    states = _table("trials by state (durations in seconds)", ("state", "count", "mean", "median", "max"))
    for name, stats in report.states.items():
        if stats.count:
            states.add_row(name, str(stats.count), _secs(stats.mean_s), _secs(stats.median_s),
                           _secs(stats.max_s))
    parts: list[RenderableType] = [states]
    if report.prune_steps:
        steps = ", ".join(f"{step}: {n}" for step, n in report.prune_steps.items())
        parts.append(Text(f"pruned at step (step: trials): {steps}"))
    return parts


def _devices(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    if not report.per_device:
        return []
    devices = _table("per device (busy: share of the time its host had trials running with "
                     "a trial on it; util: GPU utilization overall and while training)",
                     ("device", "trials", "done", "pruned", "fail", "run", "busy", "util",
                      "train", "kJ"))
    for use in report.per_device:
        devices.add_row(use.device, str(use.trials), *(str(use.states.get(s, 0)) for s in
                                                       ("COMPLETE", "PRUNED", "FAIL", "RUNNING")),
                        _pct(use.busy_fraction, fraction=True), _pct(use.util_mean),
                        _pct(use.util_compute_mean),
                        "-" if use.energy_kj is None else f"{use.energy_kj:.1f}")
    return [devices]


def _placement(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    """What trials_per_gpu=auto and objective.device=auto did, per host."""
    packing = [Text("\n".join(lines)) for lines in map(packing_lines, report.packing) if lines]
    return [*packing, *(Text(device_choice_line(entry)) for entry in report.device_choices)]


def _running(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    parts: list[RenderableType] = []
    if report.running:
        running = _table("running", ("trial", "device", "elapsed s", "last step", "heartbeat age s"))
        for entry in report.running:
            beat = _secs(entry["heartbeat_age_s"]) + (" STALE" if entry["stale"] else "")
            step = "setup still running" if entry.get("setup_running") else \
                "-" if entry["last_step"] is None else str(entry["last_step"])
            running.add_row(str(entry["number"]), entry["device"], _secs(entry["elapsed_s"]),
                            step, beat)
        parts.append(running)
        if any(entry.get("outside") for entry in report.running):
            parts.append(Text("outside: made outside any run (optuna ask, another program); "
                              "its maker finishes it, no run reaps it", style="dim"))
    if report.queued:
        parts.append(Text(f"queued (asked ahead of a free slot, no process yet): "
                          f"{', '.join(f'#{n}' for n in report.queued)}", style="dim"))
    return parts


def _pruner(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    """What pruner.min_resource=auto and pruner.tune=auto chose."""
    parts: list[RenderableType] = []
    if report.min_resource_auto:
        auto = report.min_resource_auto
        parts.append(Text(f"pruner.min_resource=auto chose {auto.get('min_resource')}"
                          + (f" (at trial {auto['at_trial']})" if auto.get("at_trial") is not None else "")
                          + f": {auto.get('reason', '')}"))
    tuning = pruner_tuning_lines(report)
    if tuning:
        parts.append(Text("\n".join(tuning)))
    return parts


def _outcomes(report: StatusReport, _typed: Callable[[str], str]) -> list[RenderableType]:
    """Failures by reason, the best trial, a Pareto front."""
    parts: list[RenderableType] = []
    if report.fail_reasons:
        reasons = ", ".join(f"{k}: {v}" for k, v in report.fail_reasons.items())
        parts.append(Text(f"failures by reason: {reasons}", style="yellow"))
    if report.best:
        params = " ".join(f"{k}={_fmt(v)}" for k, v in report.best["params"].items())
        parts.append(Text.assemble(("best ", "bold"),
                                   f"trial {report.best['number']}: {report.best['value']!r}",
                                   f"  params: {params}"))
    if report.best_trials:
        parts.append(_pareto_front(report))
    return parts


def _findings(report: StatusReport, typed: Callable[[str], str]) -> list[RenderableType]:
    if not report.findings:
        return [Text("findings: none (no idle or underused GPU, slow start-up, early pruning, "
                     "stale trial or parameter mismatch found)", style="green")]
    parts: list[RenderableType] = [Text("findings", style="bold")]
    for finding in report.findings:
        style = "yellow" if finding.severity == "warning" else "cyan"
        parts.append(Text.assemble((f"  ! {finding.code}: ", f"bold {style}"), finding.message))
        parts.append(Text(f"    -> {typed(finding.advice)}", style="dim"))
    return parts


_SECTIONS = (_heading, _states, _devices, _placement, _running, _pruner, _outcomes, _findings)


_FRONT_SHOWN = 10  # Pareto trials listed in full; `best` lists them all


def _pareto_front(report: StatusReport) -> Text:
    front = report.best_trials
    lines = [f"Pareto front: {len(front)} trial(s) ({', '.join(report.directions)})"]
    for trial in front[:_FRONT_SHOWN]:
        values = ", ".join(repr(v) for v in trial["values"])
        params = " ".join(f"{k}={_fmt(v)}" for k, v in trial["params"].items())
        lines.append(f"  trial {trial['number']}: {values}  params: {params}")
    if len(front) > _FRONT_SHOWN:
        lines.append(f"  ... {len(front) - _FRONT_SHOWN} more: hpo-orchestrator best --study "
                     f"{report.study} lists them all")
    return Text("\n".join(lines))


def _fmt(value: object) -> str:
    """As it would be pasted back: floats in full (repr round-trips), strings quoted if needed."""
    if isinstance(value, str) and (not value or any(c in value for c in " ,=[]{}'\"")):
        return repr(value)
    return repr(value) if isinstance(value, float) else str(value)


def print_status(report: StatusReport, console: Console,
                 typed: Callable[[str], str] = str) -> None:
    console.print(render_status(report, typed))
