"""docs/QUALITY.md and docs/quality/*.md cite only figures that rebuild from the raw results
kept in docs/quality-data/: the goals table is ``scripts/bench_quality.py --goals``'s output,
and every table block marked ``<!-- rebuilt: FOLDER FILE WORKLOAD GROUP -->`` is that
group's ``--report-only`` section. A change to the arithmetic, to the kept data or to the
page that makes them differ fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.benchmarking.goals import goals_table
from scripts.benchmarking.tables import Store

DOCS = Path(__file__).resolve().parents[2] / "docs"
DATA = DOCS / "quality-data"
BLOCK = re.compile(r"<!-- rebuilt: (\S+) (\S+) (\S+) (\S+) -->\n(.*?)\n<!-- end rebuilt -->", re.S)


def _blocks() -> list[tuple[str, tuple[str, str, str, str], str]]:
    return [(path.name, m.groups()[:4], m.group(5)) for path in sorted((DOCS / "quality").glob("*.md"))
            for m in BLOCK.finditer(path.read_text())]


def test_the_goals_table_is_the_judgement_of_the_kept_results() -> None:
    page = (DOCS / "QUALITY.md").read_text()
    shown = page.split("<!-- goals:begin -->\n", 1)[1].split("<!-- goals:end -->", 1)[0]
    assert shown == goals_table(DATA), "rebuild: python scripts/bench_quality.py --goals docs/quality-data"


def test_the_first_page_reads_in_ten_minutes() -> None:
    assert len((DOCS / "QUALITY.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize(("doc", "key", "shown"), _blocks(), ids=lambda v: str(v)[:60])
def test_every_rebuilt_block_is_the_report_of_its_raw_results(
        doc: str, key: tuple[str, str, str, str], shown: str) -> None:
    folder, kept, workload, group = key
    section = Store(DATA / folder, kept=kept).section(workload, group, plot=False)
    expected = "\n".join(line for line in section
                         if not line.startswith(("## ", "!["))).strip()
    assert shown.strip() == expected, f"{doc}: {key}"


def test_every_kept_group_is_shown_once() -> None:
    """No kept comparison goes unreported, and none is reported twice (one place to update)."""
    kept = set()
    for path in DATA.glob("*/*.json.gz"):
        store = Store(path.parent, kept=path.name)
        kept |= {(path.parent.name, path.name, r["workload"], r["group"]) for r in store.runs
                 if r["group"] != "reference"}
    shown = [key for _doc, key, _text in _blocks()]
    assert sorted(shown) == sorted(kept)
