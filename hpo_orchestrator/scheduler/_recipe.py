"""The loop as a recipe: the orchestrator's periodic duties, one ordered list, each a ``Duty``
run once per round of the loop and timed (as Ray Tune's ``TuneController.step`` runs its
steps). A duty slower than ``slow_s`` is logged at DEBUG (``hpo-orchestrator --debug``), and
the time each took is kept, so a loop that falls behind says which duty held it.

Order matters and is the list's: the study's deadline before launching, launching before the
GPU packer reads the slots, the exit check before waiting on the children's calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Duty", "Recipe"]

_log = logging.getLogger("hpo_orchestrator")
_SLOW_S = 0.25  # the loop polls every 0.1 s: a duty past this holds the trials' calls up


@dataclass(frozen=True)
class Duty:
    """One thing the loop does every round. ``ends_loop``: its truthy result ends the loop
    (the duties after it wait for the next round, which does not come)."""

    name: str
    run: Callable[[], object]
    ends_loop: bool = False


class Recipe:
    def __init__(self, duties: list[Duty], slow_s: float = _SLOW_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if len({d.name for d in duties}) != len(duties):
            raise ValueError("each duty needs its own name")
        self.duties = duties
        self.slow_s = slow_s
        self._clock = clock
        self.spent: dict[str, float] = dict.fromkeys((d.name for d in duties), 0.0)

    def round(self) -> bool:
        """Run the duties in order; True when one that ends the loop says so."""
        for duty in self.duties:
            started = self._clock()
            result = duty.run()
            took = self._clock() - started
            self.spent[duty.name] += took
            if took >= self.slow_s:
                _log.debug("loop: %s took %.3f s", duty.name, took)
            if duty.ends_loop and result:
                return True
        return False
