"""``hpo-orchestrator report``: where a study's GPU time went, as HTML (plotly) or PNG.

Four charts from plain SQL over the storage: trials per GPU over time (colored by final
state, so idle gaps and pruned trials show), each GPU's utilization from ``hpo_telemetry``,
the steps at which trials were pruned, and the optimization history.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import Engine

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.report._data import ReportData, collect_report, lane_device
from hpo_orchestrator.report._html import CHART_IDS, render_html
from hpo_orchestrator.report._png import render_png

__all__ = ["CHART_IDS", "ReportData", "collect_report", "lane_device", "render_html", "render_png",
           "write_report"]


def _check_target(path: Path, suffix: str, option: str) -> None:
    if path.suffix.lower() != suffix:
        raise ConfigError(f"{option} {path}: expected a {suffix} file name",
                          f"e.g. {option} report{suffix}")
    if not path.parent.is_dir():
        raise ConfigError(f"{option} {path}: folder {path.parent} does not exist",
                          "create it first or write the report elsewhere")


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Write to a temporary file beside ``path`` and rename it: never a half-written report."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes it private; a report is for sharing
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_report(engine: Engine, study: str | None, html_path: Path | None,
                 png_path: Path | None, last: int | None = None) -> ReportData:
    """Collect once, render to each target asked for. Targets are checked before anything
    is read, so bad input writes nothing."""
    if html_path is None and png_path is None:
        raise ConfigError("nothing to write", "pass --out report.html and/or --png report.png")
    if html_path is not None:
        _check_target(html_path, ".html", "--out")
    if png_path is not None:
        _check_target(png_path, ".png", "--png")
    data = collect_report(engine, study, last)
    if html_path is not None:
        page = render_html(data)
        _atomic_write(html_path, lambda p: p.write_text(page, encoding="utf-8"))
    if png_path is not None:
        _atomic_write(png_path, lambda p: render_png(data, p))
    return data
