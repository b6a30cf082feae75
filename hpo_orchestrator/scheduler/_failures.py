"""When a run stops because its trials keep failing: a pure rule, fed each ended trial.

A study whose objective always raises should not run all its n_trials and exit 0 with a
progress bar full of failures. Three rules, over the trials this run ended (a new run of the
same study starts afresh, so a fixed objective resumes without tripping over old failures):

- ``study.fail_fast`` (default 5): the first K trials all failed with the same error;
- ``study.max_failures`` (default null: no limit): more than this many failed;
- at the end: every trial the run ended failed (fewer than K, so the first rule never fired).

Trials that failed through no fault of the objective and run again (``hpo.retried``) and
those we stopped (``interrupted``) do not count.

A full disk (``disk_full``: a write of the trial's refused for want of space) stops the run at
once, whatever these rules say: every later trial would fail alike and be blamed on the
objective, and a run that went on would report its budget finished by failures.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FailurePolicy", "Halt", "disk_full"]


@dataclass(frozen=True)
class Halt:
    """Why the run stops: one error line and what to do next (the CLI prints both, exit 1)."""

    message: str
    hint: str
    rule: str  # the setting that stopped it: study.fail_fast, study.max_failures, ...
    exit_code: int = 1  # 2: the run's input was wrong (a custom objective's changed space)


@dataclass
class FailurePolicy:
    fail_fast: int  # 0: off
    max_failures: int | None
    ended: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_trial: dict[str, int] = field(default_factory=dict)  # error -> first trial with it
    first_error: dict[str, str] = field(default_factory=dict)  # ... and its text as it was
    _first_errors: list[str] = field(default_factory=list)

    @staticmethod
    def _key(error: str | None, reason: str | None) -> str:
        """Errors that differ only in numbers (values, addresses, line numbers) are the same."""
        return re.sub(r"\d+(\.\d+)?", "#", error or reason or "unknown error")

    def observe(self, number: int, failed: bool, reason: str | None, error: str | None,
                retried: bool) -> Halt | None:
        """One more ended trial; a Halt when the run should stop now."""
        if retried or reason == "interrupted":
            return None
        self.ended += 1
        if not failed:
            return None
        self.failed += 1
        key = self._key(error, reason)
        self.errors[key] += 1
        self.first_trial.setdefault(key, number)
        self.first_error.setdefault(key, error or reason or "unknown error")
        if len(self._first_errors) < self.fail_fast and self.ended == self.failed:
            self._first_errors.append(key)
            if len(self._first_errors) == self.fail_fast and len(set(self._first_errors)) == 1:
                return self._halt(f"the first {self.fail_fast} trials all failed with the same "
                                  f"error", key, "study.fail_fast=0 turns this check off",
                                  "study.fail_fast")
        if self.max_failures is not None and self.failed > self.max_failures:
            common = self.errors.most_common(1)[0][0]
            return self._halt(f"{self.failed} trials failed, more than study.max_failures="
                              f"{self.max_failures}", common,
                              "raise study.max_failures (null: no limit)", "study.max_failures")
        return None

    def at_end(self) -> Halt | None:
        """After the run: did every trial it ended fail?"""
        if self.failed == 0 or self.failed < self.ended:
            return None
        common = self.errors.most_common(1)[0][0]
        # the run ended at its budget: the same command would find nothing to run
        return self._halt(f"every trial of this run failed ({self.failed})", common, None,
                          "the failure policy", again="the same command with study.add_trials=N "
                          "(the failed trials count in study.n_trials)")

    def _halt(self, what: str, key: str, knob: str | None, rule: str,
              again: str = "the same command again") -> Halt:
        number = self.first_trial[key]
        shown = self.first_error[key]
        hint = (f"'hpo-orchestrator logs {number}' shows its output and traceback; fix the "
                f"objective and run {again}")
        return Halt(f"{what}: {shown} (first in trial {number})",
                    hint + (f" ({knob})" if knob else ""), rule)


def disk_full(number: int, error: str | None, run_folder: Path) -> Halt:
    """Trial ``number`` could not write for want of space: stop the run (exit 1), naming the
    run folder's free space (where the trial's log goes; the error names any other file)."""
    try:
        free = f"{shutil.disk_usage(run_folder).free / 2**20:.1f} MiB free"
    except OSError:
        free = "its free space unknown"
    return Halt(f"no space left on a disk that trial {number} writes to: "
                f"{error or 'no space left on device'}",
                f"free space on the file system of the trial logs ({run_folder}: {free}) or of "
                f"the file the error names (scheduler.log_dir moves the logs); then run the same "
                f"command again: trial {number} and the trials stopped with it run first, each "
                f"counted once", "a full disk")
