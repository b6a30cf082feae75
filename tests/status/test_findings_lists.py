"""The trials a finding names (status/_findings.py, ``gpu_unused`` and ``stale_running``):
at most eight, by number, then how many more; written for the mutants mutmut found
unguarded (docs/MUTATION.md, "mutmut")."""

from __future__ import annotations

import pytest

from hpo_orchestrator.status._findings import _few


@pytest.mark.parametrize(("count", "said"), [
    (0, ""),
    (1, "#0"),
    (8, "#0, #1, #2, #3, #4, #5, #6, #7"),
    (9, "#0, #1, #2, #3, #4, #5, #6, #7 and 1 more"),
    (12, "#0, #1, #2, #3, #4, #5, #6, #7 and 4 more"),
])
def test_a_finding_names_eight_trials_then_how_many_more(count: int, said: str) -> None:
    assert _few(list(range(count))) == said
