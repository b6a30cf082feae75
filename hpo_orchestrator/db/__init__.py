"""The one gateway to the database: the only code that knows Optuna's tables and ours.

Every SQL statement of the project lives in this package (docs/DESIGN.md §3.2).
"""

from __future__ import annotations

__all__: list[str] = []
