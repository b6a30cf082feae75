"""The same four charts as the HTML report, as one PNG (matplotlib, no browser needed)."""

from __future__ import annotations

from pathlib import Path

from hpo_orchestrator.report._data import CPU_AXIS, ReportData, no_pruned_trial, prune_histogram
from hpo_orchestrator.report._html import STATE_COLORS

__all__ = ["render_png"]


def render_png(data: ReportData, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on a GPU node
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    lanes = max(1, len(data.lanes))
    figure, axes = plt.subplots(4, 1, figsize=(12, 4 + 0.28 * lanes + 9),
                                gridspec_kw={"height_ratios": [max(2.5, 0.28 * lanes), 3, 2.5, 3]})
    timeline, utilization, prune, history = axes
    drawn = f" (trials #{data.first_number} on: the newest {len(data.bars)})" if data.first_number else ""
    figure.suptitle(f"Study {data.study}{drawn}", fontweight="bold")

    row_of = {lane: len(data.lanes) - 1 - i for i, lane in enumerate(data.lanes)}
    for bar in data.bars:
        timeline.barh(row_of[bar.lane], max(bar.end - bar.start, 0.01), left=bar.start, height=0.8,
                      color=STATE_COLORS.get(bar.state, "#7f7f7f"), edgecolor="white", linewidth=0.5)
    timeline.set_yticks(list(row_of.values()), list(row_of))
    timeline.set_title("Trials per device (gaps are idle time)")
    timeline.set_xlabel("seconds since the first trial started")
    states = sorted({b.state for b in data.bars})
    timeline.legend(handles=[Patch(color=STATE_COLORS.get(s, "#7f7f7f"), label=s.lower())
                             for s in states], loc="upper right", fontsize="small")

    for series in data.utilization:
        utilization.plot(series.t, series.util, label=series.device, linewidth=1, marker=".",
                         markersize=3)
    if data.utilization:
        utilization.legend(loc="upper right", fontsize="small")
    gpu = data.utilization_kind == "gpu"
    utilization.set_title("GPU utilization over time (hpo_telemetry)" if gpu
                          else "CPU use of the trials over time (no GPU in this study)")
    utilization.set_ylabel("SM utilization %" if gpu else CPU_AXIS)
    utilization.set_xlabel("seconds since the first trial started")
    if data.bars:  # the same time axis as the timeline
        utilization.set_xlim(timeline.get_xlim())

    steps, counts = prune_histogram(data)
    rate = data.status.prune_rate
    said = no_pruned_trial(data)
    if said is not None:  # no empty frame: the panel says so
        title, _, words = said.partition(": ")
        prune.set_title(title)
        prune.text(0.5, 0.5, words, ha="center", va="center", transform=prune.transAxes)
        prune.set_axis_off()
    else:
        prune.bar(steps, counts, color=STATE_COLORS["PRUNED"])
        prune.set_title("Where trials were pruned" + (f" (prune rate {rate:.0%})"
                                                      if rate is not None else ""))
        prune.set_xlabel("step of the last report")
        prune.xaxis.set_major_locator(MaxNLocator(integer=True))
        prune.yaxis.set_major_locator(MaxNLocator(integer=True))
    prune.set_ylabel("trials")

    history.scatter([n for n, _ in data.history], [v for _, v in data.history], s=12,
                    color=STATE_COLORS["COMPLETE"], label="objective value")
    history.plot([n for n, _ in data.best_so_far], [v for _, v in data.best_so_far],
                 color="#d62728", label="best so far")
    history.set_title(f"Optimization history ({data.direction})")
    history.set_xlabel("trial number")
    history.set_ylabel("value")
    if data.history:
        history.legend(loc="upper right", fontsize="small")

    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
