#!/usr/bin/env python3
"""Render a report in headless Chromium, check that every chart was drawn, save a picture of
the whole page (docs/REPORT.md's docs/report.png came from this).

Usage: python scripts/report_screenshot.py REPORT.html OUT.png
"""

from __future__ import annotations

import sys
from pathlib import Path

from _checkout import on_path

on_path()  # tests/browser.py

from hpo_orchestrator.report import CHART_IDS  # noqa: E402
from tests.browser import browser_unavailable, check_report  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    reason = browser_unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    checks = check_report(Path(sys.argv[1]), CHART_IDS, screenshot=Path(sys.argv[2]))
    for check in checks:
        print(f"{check.chart_id}: svg={check.svg} traces={check.traces} "
              f"colored={check.colored_fraction:.3%}")
    return 0 if all(c.svg for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
