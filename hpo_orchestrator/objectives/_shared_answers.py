"""``objective.device=auto``'s answers shared between the workers of one run on one host
(objectives/_device.py says why and when they hold).

One JSON file per measured answer in the folder the orchestrator names for the run and host
(``slot_info().shared_dir``), named by a hash of its key: the context (the GPU's model,
LightGBM's version), the learners measured with their device params, the data and bins, the
threads and ``num_leaves``. Written whole (a temporary file, then ``os.replace``), so a
reader sees a file complete or not at all; two workers that measured the same picture at
once replace each other's file with an answer of the same key, and nothing is lost that
matters. Nothing here raises into a trial: a folder that cannot be read or written, or a file
that does not parse or has another shape, is as if absent (the worker measures).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["SharedAnswers"]

_FORMAT = 1
_PREFIX = "device-"


def _canonical(value: Any) -> str:
    """One text per value: tuples and lists alike (a key read back from JSON has lists)."""
    return json.dumps(value, sort_keys=True, default=str)


class SharedAnswers:
    """The shared folder of one run on one host, for a worker whose GPU and LightGBM are
    ``context`` (e.g. ``{"gpu": "NVIDIA H100 80GB HBM3", "lightgbm": "4.7.0"}``): answers
    measured under another context are never read, so the workers of a host with GPUs of
    two models do not share."""

    def __init__(self, folder: Path, context: dict[str, Any]) -> None:
        self.folder = folder
        self.context = context

    def _scope(self, fixed: Any, learners: dict[str, dict[str, Any]]) -> str:
        return _canonical([self.context, learners, fixed])

    def write(self, fixed: Any, threads: int | None, leaves: int,
              learners: dict[str, dict[str, Any]], answer: dict[str, Any]) -> None:
        """The answer measured for the picture of ``fixed`` (data, bins), ``threads`` and
        ``leaves`` (objectives/_device.py, ``Picture``) with ``learners``."""
        scope = self._scope(fixed, learners)
        digest = hashlib.sha1(_canonical([scope, threads, leaves]).encode()).hexdigest()
        path = self.folder / f"{_PREFIX}{digest[:24]}.json"
        temporary = self.folder / f".{path.name}.{os.getpid()}.tmp"  # not matched by read
        record = {"format": _FORMAT, "scope": scope, "threads": threads, "leaves": leaves,
                  "answer": answer}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(record, default=str))
            os.replace(temporary, path)
        except (OSError, TypeError, ValueError):  # the others measure for themselves
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)

    def read(self, fixed: Any, learners: dict[str, dict[str, Any]],
             ) -> Iterator[tuple[int | None, int, dict[str, Any]]]:
        """Every answer in the folder for ``fixed`` (data, bins) under this context and
        ``learners``, as (threads, leaves, the answer); what does not parse is skipped."""
        scope = self._scope(fixed, learners)
        try:
            paths = sorted(self.folder.glob(f"{_PREFIX}*.json"))
        except OSError:
            return
        for path in paths:
            try:
                record = json.loads(path.read_text())
                threads, leaves, answer = record["threads"], record["leaves"], record["answer"]
                if record["format"] != _FORMAT or record["scope"] != scope \
                        or not (threads is None or _positive(threads)) or not _positive(leaves) \
                        or answer.get("learner") not in learners \
                        or not isinstance(answer.get("reason"), str):
                    continue
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue  # half-written by hand, truncated, another shape: measure instead
            yield threads, leaves, answer


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
