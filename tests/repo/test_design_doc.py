"""docs/DESIGN.md's attribute catalogue (§2.3) and the code name the same ``hpo.*`` keys: a key
the code writes or reads is part of the user contract, so it must be documented, and a
documented key must exist."""

from __future__ import annotations

import re

from tests.conftest import REPO

# A quoted key in the code: "hpo.gpu_index", 'hpo.attempt' inside SQL, and prefixes of keys
# with a variable part: f"hpo.devices.{host}", 'hpo.devices.%' (LIKE), "hpo.devices." (startswith).
_CODE_KEY = re.compile(r"""["'](hpo(?:\.[a-z0-9_]+)+)(\.)?(?:\{[^}"']*\}|%)?["']""")
# A row of the catalogue: | `hpo.devices.<host>` | ...
_DOC_KEY = re.compile(r"^\| `(hpo(?:\.[a-z0-9_]+)+)(\.<[a-z_]+>)?` \|", re.MULTILINE)


def _code_keys() -> set[str]:
    keys = set()
    for path in (REPO / "hpo_orchestrator").rglob("*.py"):
        for key, dot, *_ in _CODE_KEY.findall(path.read_text()):
            keys.add(key + "." if dot else key)
    return keys


def _doc_keys() -> set[str]:
    section = (REPO / "docs" / "DESIGN.md").read_text().split("### 2.3", 1)[1].split("\n### ", 1)[0]
    return {key + "." if variable else key for key, variable in _DOC_KEY.findall(section)}


def test_every_key_in_the_code_is_in_the_catalogue() -> None:
    undocumented = _code_keys() - _doc_keys()
    assert not undocumented, f"add these to docs/DESIGN.md §2.3: {sorted(undocumented)}"


def test_every_documented_key_is_in_the_code() -> None:
    stale = _doc_keys() - _code_keys()
    assert not stale, f"docs/DESIGN.md §2.3 lists keys no code uses: {sorted(stale)}"


def test_the_catalogue_is_read() -> None:
    """Guards the two tests above against a pattern that matches nothing."""
    assert {"hpo.gpu_index", "hpo.config", "hpo.devices.", "hpo.pruner.min_resource_auto"} <= (
        _code_keys() & _doc_keys())
