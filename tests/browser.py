"""Open a report in headless Chromium and check that its charts were drawn.

Used by tests/report/test_report.py and by scripts/report_screenshot.py (docs/REPORT.md's picture).
Needs Debian's ``chromium`` and ``chromium-driver`` (or any Chrome with its chromedriver)
and the ``selenium`` package (the ``dev`` extra).

"Drawn" means: plotly built the chart's SVG, and the chart's plot area (the rectangle inside
the axes) holds colored pixels. Gridlines, axes and text are gray, data marks are colored, so
a chart whose traces did not render reads as 0 colored pixels even though its frame shows.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChartCheck", "browser_unavailable", "check_report", "find_browser", "report_page_eval"]

_CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


@dataclass(frozen=True)
class ChartCheck:
    chart_id: str
    svg: bool  # plotly built the chart's SVG
    traces: int  # trace groups plotly drew
    colored_fraction: float  # share of the plot area's pixels that are colored (data marks)


def find_browser() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, from $HPO_CHROMIUM / $HPO_CHROMEDRIVER or PATH."""
    browser = os.environ.get("HPO_CHROMIUM") or next(
        (p for p in map(shutil.which, _CHROMIUM) if p), None)
    driver = os.environ.get("HPO_CHROMEDRIVER") or shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def browser_unavailable() -> str | None:
    """Why a report cannot be opened in a browser here, or None when it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if find_browser() is None:
        return "no chromium + chromedriver on PATH (apt-get install chromium chromium-driver)"
    return None


def _colored_fraction(png: bytes, box: tuple[int, int, int, int]) -> float:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    left, top, right, bottom = box
    area = image.crop((max(0, left), max(0, top), min(image.width, right), min(image.height, bottom)))
    raw = area.tobytes()
    if not raw:
        return 0.0
    pixels = zip(raw[0::3], raw[1::3], raw[2::3], strict=True)
    colored = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 40)
    return colored / (len(raw) // 3)


@contextlib.contextmanager
def _report_in_chromium(html: Path, charts: int, width: int = 1280) -> Iterator[Any]:
    """A headless Chromium (selenium driver) that has loaded ``html`` and drawn its charts."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    found = find_browser()
    if found is None:
        raise RuntimeError(browser_unavailable() or "no browser")
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="hpo-chromium-")
    # No network, no sandbox (root in CI), and nothing that phones home: the page is local.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--hide-scrollbars", f"--window-size={width},1000",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(html.resolve().as_uri())
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(
            "return document.querySelectorAll('.chart .main-svg').length") >= charts)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def report_page_eval(html: Path, charts: int, script: str) -> Any:
    """Load ``html`` in headless Chromium, wait for its charts, and return what the JavaScript
    ``script`` (a function body: ``return ...``) returns there."""
    with _report_in_chromium(html, charts) as driver:
        return driver.execute_script(script)


def check_report(html: Path, chart_ids: tuple[str, ...], screenshot: Path | None = None,
                 width: int = 1280) -> list[ChartCheck]:
    """Load ``html`` in headless Chromium; per chart, whether it was drawn. Optionally save a
    screenshot of the whole page."""
    from selenium.webdriver.common.by import By

    with _report_in_chromium(html, len(chart_ids), width) as driver:
        results = []
        for chart_id in chart_ids:
            chart = driver.find_element(By.ID, chart_id)
            driver.execute_script("arguments[0].scrollIntoView();", chart)
            box = driver.execute_script(
                "const c = arguments[0].getBoundingClientRect();"
                "const p = arguments[0].querySelector('.nsewdrag');"
                "if (!p) return null; const r = p.getBoundingClientRect();"
                "return [r.left - c.left, r.top - c.top, r.right - c.left, r.bottom - c.top];", chart)
            traces = driver.execute_script(
                "return arguments[0].querySelectorAll('g.trace').length;",
                chart)
            left, top, right, bottom = (int(v) for v in box) if box else (0, 0, 0, 0)
            fraction = _colored_fraction(chart.screenshot_as_png, (left, top, right, bottom))
            results.append(ChartCheck(chart_id, svg=box is not None, traces=int(traces),
                                      colored_fraction=fraction))
        if screenshot is not None:  # the whole page, not only the window
            size = driver.execute_script("return [document.documentElement.scrollWidth, "
                                         "document.documentElement.scrollHeight];")
            shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}})
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        return results
