"""The report as one self-contained HTML page (plotly, as Optuna's own visualizations use).

plotly.js is inlined, so the page opens on an offline GPU node and in a browser without
network. Each chart is its own ``<div class="chart" id=...>``, which a browser test can find.
"""

from __future__ import annotations

from typing import Any

import jinja2
import markupsafe

from hpo_orchestrator.report._data import CPU_AXIS, ReportData, no_pruned_trial, prune_histogram
from hpo_orchestrator.status import device_choice_line, packing_lines, pruner_tuning_lines

__all__ = ["STATE_COLORS", "render_html"]

# Final state -> color, shared with the PNG renderer so both read alike.
STATE_COLORS = {"COMPLETE": "#2ca02c", "PRUNED": "#ff7f0e", "FAIL": "#d62728",
                "RUNNING": "#1f77b4", "WAITING": "#7f7f7f"}
CHART_IDS = ("timeline", "utilization", "prune-steps", "history")


def _layout(title: str, height: int, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "height": height, "margin": {"l": 90, "r": 30, "t": 50, "b": 50},
            "template": "plotly_white", **extra}


def _timeline(data: ReportData) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    for state, color in STATE_COLORS.items():
        bars = [b for b in data.bars if b.state == state]
        if not bars:
            continue
        figure.add_trace(go.Bar(
            name=state.lower(), orientation="h", y=[b.lane for b in bars],
            base=[b.start for b in bars], x=[max(b.end - b.start, 0.01) for b in bars],
            marker={"color": color, "line": {"color": "white", "width": 0.5}},
            customdata=[[b.number, b.last_step, "-" if b.value is None else f"{b.value:.5g}",
                         b.end - b.start] for b in bars],
            hovertemplate="trial %{customdata[0]}<br>%{customdata[3]:.1f} s, last step "
                          "%{customdata[1]}<br>value %{customdata[2]}<extra>" + state.lower()
                          + "</extra>"))
    figure.update_layout(**_layout(
        "Trials per device (gaps are idle time)", max(260, 40 + 26 * len(data.lanes)),
        barmode="overlay", xaxis_title="seconds since the first trial started",
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(data.lanes))}))
    return figure


def _utilization(data: ReportData) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    for series in data.utilization:
        figure.add_trace(go.Scatter(x=series.t, y=series.util, mode="lines+markers",
                                    marker={"size": 3}, name=series.device))
    if data.utilization_kind == "gpu":
        title, axis = "GPU utilization over time (hpo_telemetry)", "SM utilization %"
    else:
        title, axis = "CPU use of the trials over time (no GPU in this study)", CPU_AXIS
    if not data.utilization:
        title += ": no samples"
    span = max((b.end for b in data.bars), default=0.0)  # the timeline's axis, for comparison
    figure.update_layout(**_layout(title, 320, yaxis_title=axis, xaxis={
        "title": {"text": "seconds since the first trial started"},
        "range": [0, span] if span else None}))
    return figure


def _prune_steps(data: ReportData) -> Any:
    import plotly.graph_objects as go

    steps, counts = prune_histogram(data)
    rate = data.status.prune_rate
    title = "Where trials were pruned" + (f" (prune rate {rate:.0%})" if rate is not None else "")
    figure = go.Figure(go.Bar(x=steps, y=counts, marker={"color": STATE_COLORS["PRUNED"]},
                              name="pruned"))
    figure.update_layout(**_layout(title, 300, xaxis_title="step of the last report",
                                   yaxis_title="trials", xaxis={"dtick": 1 if len(steps) <= 30 else None}))
    return figure


def _history(data: ReportData) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    figure.add_trace(go.Scatter(x=[n for n, _ in data.history], y=[v for _, v in data.history],
                                mode="markers", name="objective value",
                                marker={"color": STATE_COLORS["COMPLETE"]}))
    figure.add_trace(go.Scatter(x=[n for n, _ in data.best_so_far],
                                y=[v for _, v in data.best_so_far], mode="lines",
                                name="best so far", line={"color": "#d62728"}))
    title = f"Optimization history ({data.direction})"
    if not data.history:
        title += ": no completed trial"
    figure.update_layout(**_layout(title, 320, xaxis_title="trial number", yaxis_title="value"))
    return figure


# Every value reaches the page through this template, and the environment escapes each one
# (autoescape): the study's name, attrs, hosts, errors and params come from whoever can write
# to the storage (another host, `optuna study set-user-attr`, a shared .db file), so escaping
# is the default rather than a habit per field. Only plotly's own output is marked safe: it
# writes the charts' data as JSON with <, > and / escaped.
_PAGE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""\
<!DOCTYPE html><html><head><meta charset='utf-8'>
<title>hpo-orchestrator report: {{ study }}</title>
<style>body{font-family:sans-serif;margin:24px;max-width:1200px}.chart{margin-bottom:16px}</style>
</head><body>
<h1>Study {{ study }}</h1>
<p>{{ counts }}; first trial started {{ started }}; wall time {{ wall }}</p>
{% if drawn %}<p>The charts of trials draw the newest {{ drawn }},
from trial #{{ first_number }} on (--last); the summary covers every trial.</p>{% endif %}
{% if auto %}<p>pruner.min_resource=auto chose <b>{{ auto.min_resource }}</b>:
{{ auto.reason }}</p>{% endif %}
{% if tuning %}<h3>Pruner tuning</h3><pre>{{ tuning }}</pre>{% endif %}
<h3>Devices</h3><ul>
{% for d in devices %}<li>{{ d }}</li>{% else %}<li>none recorded</li>{% endfor %}
</ul>
{% for line in device_choices %}<p>{{ line }}</p>{% endfor %}
{% if packing %}<h3>Trials per GPU</h3>{% for block in packing %}<pre>{{ block }}</pre>{% endfor %}{% endif %}
{% if front %}<h3>Pareto front ({{ directions }})</h3><ul>
{% for number, values in front %}<li>trial {{ number }}: {{ values }}</li>{% endfor %}
</ul>{% endif %}
<h3>Findings</h3><ul>
{% for f in findings %}<li><b>{{ f.code }}</b>: {{ f.message }}<br><i>{{ f.advice }}</i></li>
{% else %}<li>none</li>{% endfor %}
</ul>
{% for chart_id, chart in charts %}<div class="chart" id="{{ chart_id }}">{{ chart }}</div>{% endfor %}
</body></html>
""")


def _device_line(device: Any) -> str:
    busy = "-" if device.busy_fraction is None else f"{device.busy_fraction:.0%}"
    util = "" if device.util_mean is None else f", GPU utilization {device.util_mean:.0f}%"
    return f"{device.device}: {device.trials} trials, busy {busy}{util}"


def _min_resource_auto(status: Any) -> dict[str, str] | None:
    """What min_resource=auto chose, as text: the attr is the study's, written by anyone."""
    auto = status.min_resource_auto
    if not auto:
        return None
    if not isinstance(auto, dict):
        return {"min_resource": "unreadable", "reason": f"hpo.pruner.min_resource_auto is {auto!r}"}
    return {"min_resource": str(auto.get("min_resource")), "reason": str(auto.get("reason", ""))}


def render_html(data: ReportData) -> str:
    status = data.status
    figures = dict(zip(CHART_IDS, (_timeline(data), _utilization(data), _prune_steps(data),
                                   _history(data)), strict=True))
    said = no_pruned_trial(data)
    if said is not None:
        del figures["prune-steps"]
    charts: list[tuple[str, str]] = [(chart_id, markupsafe.Markup(figure.to_html(
        # plotly's own, JSON-escaped
        full_html=False, include_plotlyjs=i == 0, div_id=f"{chart_id}-plot",
        config={"displaylogo": False})))
        for i, (chart_id, figure) in enumerate(figures.items())]
    if said is not None:  # in the chart's place, in words (escaped by the template)
        charts.insert(CHART_IDS.index("prune-steps"), ("prune-steps", said))
    return _PAGE.render(
        study=data.study,
        counts=", ".join(f"{s.lower()} {v.count}" for s, v in status.states.items() if v.count),
        started=data.started_utc.strftime("%Y-%m-%d %H:%M:%S UTC") if data.started_utc else "-",
        wall=f"{status.wall_s:.0f} s" if status.wall_s is not None else "-",
        drawn=len(data.bars) if data.first_number else 0, first_number=data.first_number,
        auto=_min_resource_auto(status),
        tuning="\n".join(pruner_tuning_lines(status)),
        devices=[_device_line(d) for d in status.per_device],
        packing=["\n".join(lines) for lines in map(packing_lines, status.packing) if lines],
        device_choices=[device_choice_line(c) for c in status.device_choices],
        front=[(t["number"], ", ".join(repr(v) for v in t["values"])) for t in status.best_trials],
        directions=", ".join(status.directions),
        findings=status.findings, charts=charts)
