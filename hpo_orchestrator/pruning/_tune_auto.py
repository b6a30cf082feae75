"""``pruner.tune=auto``: the orchestrator re-tunes its pruner during the run from replays of
the study's own curves (the ``tune-pruner`` replay, pruning/_replay.py) and switches the
setting in place; workers keep running.

Every pruning decision is made here, in the orchestrator: a child's ``should_prune`` is
answered by the real ``optuna.Trial`` (scheduler/_calls.py), which asks ``study.pruner``. So
assigning ``study.pruner`` applies to the next decision of every running trial.

When: once the study has ``MIN_CURVES`` finished trials (COMPLETE or PRUNED) with
intermediate values, ``MIN_COMPLETE`` of them complete, and again after every ``EVERY`` more.
Below about 20 curves Hyperband's brackets hold a handful of trials each, so most replayed
decisions have no rival at their rung and every setting scores alike: a switch would follow
noise. Five completed trials are Optuna's own warm-up for its MedianPruner
(``n_startup_trials=5``), and the guard below needs a best trial to protect.

What: the PatientPruner(Hyperband) part of ``default_grid`` (patience x min_resource x
reduction_factor, what ``tune-pruner`` replays), over the newest ``WINDOW`` trials. Only a
setting that lets the study's best replayed trial complete is eligible; among those the one
with the least expected device time to the best wins. With the trials' order taken as
exchangeable (the sampler's order is not a property of the pruner), the best trial is equally
likely at any of the n places, so the expected device time until it ends is the mean replayed
cost of a trial times (n + 1) / 2; settings are ranked by it. The current setting stays
unless the winner saves more than ``KEEP_CURRENT_WITHIN`` of it (no flapping on noise).

Cost: a replay of 100 trials over the 108 settings takes 10-20 s of one core, so it runs in a
child process at low priority (``nice``) that reads its input from and writes its answer to a
file; the loop only reads the finished count every ``CHECK_S`` seconds, the newest ``WINDOW``
curves when a replay is due, and polls the child. One replay at a time.

Limits: those of the replay (its module doc); the best trial is the best of the replayed
window; each orchestrator of a study tunes its own pruner (the history is the study's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from hpo_orchestrator import keys
from hpo_orchestrator.config import PatientHyperbandPrunerConfig, PrunerConfig
from hpo_orchestrator.db import state_counts
from hpo_orchestrator.pruning._replay import (
    KEEP_CURRENT_WITHIN,
    PrunerSetting,
    ReplayResult,
    StudyCurves,
    default_grid,
    load_curves,
    tune,
)

if TYPE_CHECKING:
    import optuna

__all__ = ["MIN_COMPLETE", "MIN_CURVES", "Decision", "PrunerTuner", "decide", "expected_s_to_best",
           "live_grid"]

MIN_CURVES = 20  # finished trials with curves before the first replay (see the module doc)
MIN_COMPLETE = 5
EVERY = 10  # more finished trials between two replays
WINDOW = 200  # the newest trials replayed: bounds a replay's work
CHECK_S = 1.0  # how often the loop reads the finished count (one indexed COUNT: about 1 ms)
HISTORY_KEPT = 50  # switches kept in hpo.pruner_history


def expected_s_to_best(result: ReplayResult) -> float:
    """Expected device seconds until the best trial ends, trials in random order: the mean
    replayed cost of a trial times (n + 1) / 2."""
    if not result.trials:
        return math.inf
    return result.gpu_s / result.trials * (result.trials + 1) / 2


def _words(setting: PrunerSetting) -> str:
    return (f"patience={setting.patience} min_resource={setting.min_resource} "
            f"reduction_factor={setting.reduction_factor}")


def _params(setting: PrunerSetting) -> dict[str, Any]:
    return {"patience": setting.patience, "min_resource": setting.min_resource,
            "reduction_factor": setting.reduction_factor}


@dataclass
class Decision:
    switch: bool
    old: ReplayResult | None  # the live setting's replay (None: not replayed)
    new: ReplayResult | None  # the eligible setting with the least expected time (None: none)
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def decide(results: list[ReplayResult], live: PrunerSetting) -> Decision:
    """Which setting the pruner should have now, from the replays of one window."""
    best = results[0].top_k[0] if results and results[0].top_k else None
    old = next((r for r in results if r.setting == live), None)
    if best is None:
        return Decision(False, old, None, "no completed trial among the replayed ones: no best to keep")
    keeping = [r for r in results if r.setting.kind == "patient_hyperband"
               and r.outcomes.get(best) == "complete"]
    if not keeping:
        return Decision(False, old, None, f"every replayed setting prunes the best trial #{best}")
    new = min(keeping, key=lambda r: (round(expected_s_to_best(r), 6), r.prune_rate,
                                      -(r.setting.patience or 0)))
    evidence = _evidence(results, old, new, best)
    if old is not None and old.outcomes.get(best) == "complete" and (
            new.setting == live or expected_s_to_best(old) - expected_s_to_best(new)
            <= KEEP_CURRENT_WITHIN * expected_s_to_best(old)):
        if new.setting == live:
            why = (f"of the settings that let the best trial #{best} complete in replay, it "
                   "reaches it soonest")
        else:
            why = (f"it lets the best trial #{best} complete, and the best other setting that "
                   f"does ({_words(new.setting)}) would save {_share(old, new):.0%} of the "
                   f"expected device time to the best (a switch needs more than "
                   f"{KEEP_CURRENT_WITHIN:.0%})")
        return Decision(False, old, new, f"kept {_words(live)}: {why}", evidence)
    why = ("the setting as it ran prunes it in replay" if old is not None
           and old.outcomes.get(best) != "complete" else
           f"{_share(old, new):.0%} less expected device time to the best"
           if old is not None else "the setting as it ran was not replayed")
    return Decision(True, old, new, (
        f"{_words(new.setting)} lets the best trial #{best} complete and reaches it soonest: "
        f"{why} ({expected_s_to_best(new):.0f} s"
        + (f" instead of {expected_s_to_best(old):.0f} s)" if old is not None else ")")), evidence)


def _share(old: ReplayResult | None, new: ReplayResult) -> float:
    if old is None or not expected_s_to_best(old) or math.isinf(expected_s_to_best(old)):
        return 0.0
    return 1 - expected_s_to_best(new) / expected_s_to_best(old)


def _evidence(results: list[ReplayResult], old: ReplayResult | None, new: ReplayResult,
              best: int) -> dict[str, Any]:
    def one(r: ReplayResult | None) -> dict[str, Any] | None:
        if r is None:
            return None
        return {"expected_s_to_best": round(expected_s_to_best(r), 2), "device_s": round(r.gpu_s, 2),
                "prune_rate": round(r.prune_rate, 4), "keeps_best": r.outcomes.get(best) == "complete",
                "top_kept": f"{len(r.top_k_kept)}/{len(r.top_k)}", "unknown": r.unknown}
    as_run = next((r for r in results if r.current), None)
    return {"replayed_trials": new.trials, "from_trial": min(new.outcomes, default=None),
            "best_trial": best, "settings": len(results), "old": one(old), "new": one(new),
            # how well the replay reproduces what the study's configured setting really did
            "agreement": None if as_run is None or as_run.agreement is None
            else round(as_run.agreement, 4)}


def live_grid(curves: StudyCurves, live: PrunerSetting,
              max_resource: int | None) -> list[PrunerSetting]:
    """The PatientPruner(Hyperband) settings ``tune-pruner`` replays, the live one included;
    min_resource at most a fixed max_resource (Hyperband refuses more)."""
    grid = [s for s in default_grid(curves.full_step) if s.kind == "patient_hyperband"
            and (max_resource is None or (s.min_resource or 1) <= max_resource)]
    return grid if live in grid else [live, *grid]


class PrunerTuner:
    """The loop's duty for ``pruner.tune=auto``: :meth:`tick` each pass (cheap unless a
    replay is due or done), :meth:`close` at the end. Single-threaded: the orchestrator's loop.

    ``inline=True`` replays in this process (tests: deterministic and without a child)."""

    def __init__(self, study: optuna.Study, engine: Engine, config: PatientHyperbandPrunerConfig,
                 inline: bool = False) -> None:
        self.study = study
        self.engine = engine
        self.config = config
        self.max_resource = config.max_resource if isinstance(config.max_resource, int) else None
        self.live = PrunerSetting("patient_hyperband", patience=config.patience,
                                  min_resource=config.min_resource,
                                  reduction_factor=config.reduction_factor)
        self.inline = inline
        self.replayed_at = -1  # the finished count the last replay started from
        self._next_check = 0.0
        self._last_finished: int | None = None  # the finished count at this run's last check
        self._child: _Child | None = None
        self._curves: StudyCurves | None = None

    @classmethod
    def for_config(cls, study: optuna.Study, engine: Engine, config: PrunerConfig) -> PrunerTuner | None:
        """One when the config asks for pruner.tune=auto on a study that can prune."""
        if isinstance(config, PatientHyperbandPrunerConfig) and config.tune == "auto" \
                and len(study.directions) == 1:
            return cls(study, engine, config)
        return None

    def tick(self) -> None:
        if self._child is not None:
            answer = self._child.answer()
            if answer is not None:
                self._child = None
                self._conclude(answer)
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_S
        finished = self._last_finished = self._finished()
        if finished < MIN_CURVES or (self.replayed_at >= 0 and finished < self.replayed_at + EVERY):
            return
        curves = load_curves(self.engine, self.study.study_name, last=WINDOW)
        replayable = [c for c in curves.curves if c.state in ("COMPLETE", "PRUNED") and c.steps]
        complete = sum(c.state == "COMPLETE" for c in replayable)
        self.replayed_at = finished  # tried at this count: the next try comes EVERY trials later
        if len(replayable) < MIN_CURVES or complete < MIN_COMPLETE:
            # finished trials without curves (an objective that reports nothing), or all pruned
            self._verdict("waiting", f"{len(replayable)} of the newest {len(curves.curves)} trials "
                          f"finished with learning curves, {complete} of them complete; a replay "
                          f"needs {MIN_CURVES}, {MIN_COMPLETE} complete", len(replayable))
            return
        self._curves = curves
        grid = live_grid(curves, self.live, self.max_resource)
        if self.inline:
            self._conclude(("ok", tune(curves, grid)))
        else:
            self._child = _Child(curves, grid)

    def close(self, record: bool = True) -> None:
        """The run is over: a replay still running is stopped. With ``record`` (the storage
        still trusted: not after a storage failure) the verdict says so, and so it does when
        the first replay fell due after this run's last check (trials pruned at their first
        steps can finish by the dozen a second), so that status does not say "no replay yet"
        on a run that had one due."""
        # the run's end must not fail on a note about a replay: a storage in trouble is the
        # run's own error, reported by the loop
        if self._child is not None:
            self._child.stop()
            self._child = None
            if record:
                replayed = len(self._curves.curves) if self._curves else 0
                with contextlib.suppress(Exception):
                    self._verdict("stopped", "the run ended before the replay finished", replayed)
        elif record and self._last_finished is not None and self._last_finished < MIN_CURVES:
            with contextlib.suppress(Exception):
                finished = self._finished()
                if finished >= MIN_CURVES:
                    self._verdict("stopped", f"the run ended before its first replay could start "
                                  f"(one is tried at {MIN_CURVES} finished trials; "
                                  f"{finished} finished)", 0)

    def _finished(self) -> int:
        with self.engine.connect() as connection:
            counts = state_counts(connection, self.study._study_id)
        return counts.get("COMPLETE", 0) + counts.get("PRUNED", 0)

    def _conclude(self, answer: tuple[str, Any]) -> None:
        kind, payload = answer
        replayed = len(self._curves.curves) if self._curves else 0
        if kind != "ok":
            self._verdict("failed", f"the replay failed: {payload}", replayed)
            return
        decision = decide(payload, self.live)
        if decision.switch and decision.new is not None:
            self._switch(decision)
        self._verdict("switched" if decision.switch else "kept", decision.reason, replayed)

    def _switch(self, decision: Decision) -> None:
        assert decision.new is not None
        old, new = self.live, decision.new.setting
        # the next should_prune of every running trial asks this object (module doc)
        self.study.pruner = new.build(dataclasses.asdict(self.config))  # its other options kept
        self.live = new
        last = max((c.number for c in self._curves.curves), default=None) if self._curves else None
        entry = {"time": _now(), "at_trial": last, "old": _params(old), "new": _params(new),
                 "reason": decision.reason, "evidence": decision.evidence}
        stored = self.study.user_attrs.get(keys.PRUNER_HISTORY)
        history = stored if isinstance(stored, list) else []
        self.study.set_user_attr(keys.PRUNER_HISTORY, [*history, entry][-HISTORY_KEPT:])

    def _verdict(self, decision: str, reason: str, replayed: int) -> None:
        self.study.set_user_attr(keys.PRUNER_TUNING, {
            "time": _now(), "decision": decision, "reason": reason, "replayed_trials": replayed,
            "setting": _params(self.live),
            "next_at_finished": self.replayed_at + EVERY if self.replayed_at >= 0 else MIN_CURVES})


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class _Child:
    """One replay in a child process: input and answer through files, so that neither side
    waits on a pipe the other is not reading."""

    def __init__(self, curves: StudyCurves, grid: list[PrunerSetting]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="hpo-pruner-replay-"))
        (self.folder / "in.pickle").write_bytes(pickle.dumps((curves, grid)))
        with open(self.folder / "stderr.txt", "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from hpo_orchestrator.pruning._tune_auto import child_main; "
                 "child_main()", str(self.folder)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)

    def answer(self) -> tuple[str, Any] | None:
        """("ok", results) or ("error", text) once the child exited; None while it runs."""
        if self.process.poll() is None:
            return None
        try:
            return pickle.loads((self.folder / "out.pickle").read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError):
            stderr = ""
            with contextlib.suppress(OSError):
                stderr = (self.folder / "stderr.txt").read_text(errors="replace")
            tail = stderr.strip().splitlines()[-1:] or [f"exit status {self.process.returncode}"]
            return ("error", tail[0])
        finally:
            self._clean()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()
        self._clean()

    def _clean(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def child_main() -> None:
    """The replay child: below the trials in priority, it reads (curves, grid) and writes
    ("ok", results) or ("error", text)."""
    folder = Path(sys.argv[1])
    with contextlib.suppress(OSError):
        os.nice(10)
    curves, grid = pickle.loads((folder / "in.pickle").read_bytes())
    try:
        answer: tuple[str, Any] = ("ok", tune(curves, grid))
    except Exception as exc:  # sent back whole: the loop records it and goes on
        answer = ("error", f"{type(exc).__name__}: {exc}")
    temporary = folder / "out.tmp"
    temporary.write_bytes(pickle.dumps(answer))
    os.replace(temporary, folder / "out.pickle")
