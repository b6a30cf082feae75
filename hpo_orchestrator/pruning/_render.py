"""``tune-pruner`` output for a terminal (rich); ``--json`` uses ReplayResult.to_json."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from hpo_orchestrator.pruning._replay import ReplayResult, StudyCurves

__all__ = ["LIMITS", "render_tuning"]

LIMITS = ("limits: a replay runs the stored trials one after another (the real study ran them "
          "side by side, so its pruner saw fewer finished trials); a trial pruned for real that "
          "a setting would let go on has an unknown end ('?'): it is costed as running to the "
          "last step and never counts as a best value; the sampler's proposals are the study's, "
          "whatever a setting would have changed in them (pruner=hyperband splits TPE's history "
          "by bracket).")


def _ordered(results: list[ReplayResult], show: int | None) -> list[ReplayResult]:
    """Most of the best trials kept first, then most device time saved; the current setting
    is always shown."""
    ranked = sorted(results, key=lambda r: (-len(r.top_k_kept), -r.gpu_s_saved))
    if show is None or len(ranked) <= show:
        return ranked
    shown = ranked[:show]
    shown += [r for r in ranked[show:] if r.current]
    return shown


def render_tuning(curves: StudyCurves, results: list[ReplayResult], choice: ReplayResult,
                  reason: str, show: int | None = 15, command: str | None = None) -> Group:
    """``command``: the run that uses the recommendation (pruning/_command.py); without it,
    the pruner's overrides alone."""
    replayed = results[0].trials if results else 0
    newest = f" of the newest from #{curves.first_number} on (--last)" if curves.first_number else ""
    table = Table(title=f"pruner replay of study {curves.study} ({replayed} finished trials{newest}, "
                        f"{curves.direction}); {len(results)} settings, best first",
                  title_justify="left")
    for column in ("setting", "pruned", "median step", "steps", "device s", "saved s", "start-up",
                   "top kept", "best value", "?"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for r in _ordered(results, show):
        label = r.setting.short() + (" (as run)" if r.current else "")
        style = "bold green" if r is choice else ("cyan" if r.current else None)
        table.add_row(
            label, f"{r.prune_rate:.0%}", "-" if r.median_prune_step is None else f"{r.median_prune_step:g}",
            str(r.steps_run), f"{r.gpu_s:.0f}", f"{r.gpu_s_saved:+.0f}",
            "-" if r.startup_share is None else f"{r.startup_share:.0%}",
            f"{len(r.top_k_kept)}/{len(r.top_k)}",
            "-" if r.best_value is None else f"{r.best_value:.5g}", str(r.unknown) if r.unknown else "",
            style=style)
    parts: list[RenderableType] = [table, Text("PH pP mM rR: PatientPruner(patience=P) over HyperbandPruner("
                                       "min_resource=M, reduction_factor=R); H mM rR: HyperbandPruner "
                                       "alone; median wW: MedianPruner("
                                       "n_warmup_steps=W); ?: trials with an unknown end", style="dim")]
    current = next((r for r in results if r.current), None)
    if current is not None and current.agreement is not None:
        parts.append(Text(f"the replay of the setting the study ran with matches what happened for "
                          f"{current.agreement:.0%} of trials", style="dim"))
    parts.append(Text.assemble(("recommendation: ", "bold"), (choice.setting.label(), "bold green")))
    parts.append(Text(f"  why: {reason}"))
    parts.append(Text(f"  run with: {command}" if command else
                      f"  run with: hpo-orchestrator run {choice.setting.overrides()}"))
    parts.append(Text(LIMITS, style="dim"))
    return Group(*parts)
