"""Production code loads the test fakes only when the user asks for them (docs/DESIGN.md §3.4)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import cli_env

_IMPORT_ALL = """
import importlib, pathlib, sys
import hpo_orchestrator
root = pathlib.Path(hpo_orchestrator.__file__).parent
for path in sorted(root.rglob("*.py")):  # pkgutil.walk_packages would import testing/ itself
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[1] != "testing" and parts[-1] != "__main__":
        importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
from hpo_orchestrator.gpu import open_backend
backend = open_backend()
print(backend.name, any(m.startswith("hpo_orchestrator.testing") for m in sys.modules))
"""


def _backend_and_testing_loaded(env: dict[str, str] | None = None) -> list[str]:
    return subprocess.run([sys.executable, "-c", _IMPORT_ALL], env=cli_env(env), capture_output=True,
                          text=True, check=True).stdout.split()


def test_no_production_module_imports_the_fakes() -> None:
    name, testing_loaded = _backend_and_testing_loaded()
    assert name in ("nvml", "none") and testing_loaded == "False"


def test_the_fake_backend_is_opened_when_asked_for() -> None:
    assert _backend_and_testing_loaded({"HPO_ORCHESTRATOR_FAKE_GPUS": "2"}) == ["fake", "True"]
