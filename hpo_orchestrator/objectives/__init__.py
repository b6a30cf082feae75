"""Built-in objectives. Each is a class built from its ``objective.*`` config and called with
a trial; they mark their phases and log ``hpo.params_effective``."""

from __future__ import annotations

__all__: list[str] = []
