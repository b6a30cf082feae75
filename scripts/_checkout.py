"""The checkout's root on the path of a script and of every process it starts.

The benchmarks run the test objectives (tests/objectives/__init__.py), which serve this repository
only and so are not in the installed package: a script imports them, and so do the study's
own processes, by name (``objective.target=tests.objectives:NAME``). Run as
``python scripts/NAME.py``, a script has its own folder on the path, not the checkout's root.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["on_path"]


def on_path() -> Path:
    """Put the checkout's root first on ``sys.path`` and on ``PYTHONPATH``; return it."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return root
