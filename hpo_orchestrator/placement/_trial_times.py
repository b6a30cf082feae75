"""Which trials measure a GPU's level for ``scheduler.trials_per_gpu=auto``.

Measured on one H100 (issue 17, docs/BENCHMARKS.md "Costs the code cites"): in a reuse worker,
the first trial of each kind pays that kind's start-up: the gpu_mix torch trial ran 19 s the
first time in a worker (torch import, CUDA context, its data) and 8 s after; LightGBM's first
paid its OpenCL kernel build. Counted, such *warm-up* trials inflate the level they ran at. A
new worker also slows the trials beside it while it starts (imports and kernel builds take the
cores): a trial at three per GPU that overlapped one ran 12.5 s where its kind took 4-5 s, and
the level was judged "no gain" where the fixed setting gained 1.27x over two.

So a trial measures its level only when it is not a warm-up and no warm-up was starting up on
its GPU while it ran. A trial that reports steps is measured per step from its first report
on (below), and a warm-up's start-up is over by then: such a warm-up measures its level like
any trial, and slows its neighbours only until its first report. That lets a GPU's first
trials, every one a warm-up, measure level 1 while they run (the first level,
placement/_rules.py). With fresh workers (one process per trial) every trial pays its start: that is
the steady state, and nothing is a warm-up. When a study has more than ``MAX_KINDS`` kinds,
every trial is one kind (a worker's first trial is then its warm-up): with many kinds almost
every trial would be a first of its kind, and nothing would be left to measure. A warm-up is
per kind of categorical strings and bools (what a worker imports or builds for: a model
family); a trial is compared with trials that also share its categorical numbers (the CNN's
``batch_size``), which set its speed but cost no start-up. Kinds are counted from ended
trials: one seen running before its first suggestion has none yet, and warms up only as a
new worker's first.

A pruned trial runs fewer steps than a complete one of the same kind: under Optuna's
HyperbandPruner four trials in five stop at step 1, 3 or 9 of 10, and their durations differ
by 10x for that alone. Judged on whole durations, two trials decided "no gain, for good" on
a GPU three quarters idle (workload c, docs/quality/runs.md). So a trial that reported two steps
or more measures its level by its seconds per step between its first and last report (the
trial's set-up and first step left out), as kind ``<kind>/step``; one that reported a single
step is compared only with others that ended after one (``<kind>/1 step``); one that
reported none, or steps that did not rise with time, by its whole duration, as before. A
running trial counts per step once it has two reports, by what it measured between them (so
a slow one shows its loss at its next report, not before).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpo_orchestrator.placement._rules import PER_STEP, POOLED, TrialTime

__all__ = ["MAX_KINDS", "Span", "TrialTimes", "pooled_kind", "trial_kind"]

MAX_KINDS = 4
ONE_STEP = "/1 step"  # ends the kind of a trial that reported a single step
_KEPT = 1000  # ended trials kept per GPU: a level is judged on the latest few


@dataclass(frozen=True)
class Span:
    """One trial on a GPU: when it ran (``end`` None: running), in which worker process."""

    gpu: int
    worker: int  # the worker's pid
    kind: str  # trial_kind of its parameters: what a worker warms up for (its start-up)
    start: float
    end: float | None = None
    first_in_worker: bool = False
    first_of_kind: bool = False  # in its worker
    ok: bool = True  # a failed trial's duration says nothing about the level
    reports: tuple[tuple[int, float], ...] = ()  # (step, seconds since start) it reported
    compare: str = ""  # trial_kind with its categorical numbers: whom it is compared with


def _per_step(span: Span) -> bool:
    """Does the trial measure per step (two steps reported or more)?"""
    return len({step for step, _ in span.reports}) >= 2


def trial_kind(params: Mapping[str, Any], choices: Mapping[str, int] | None = None) -> str:
    """What makes trials comparable: their categorical parameters that hold a string or bool
    (gpu_mix's ``kind``, a model family) and, given ``choices`` (each categorical parameter's
    number of choices, from the trial's distributions), categorical numbers: the CNN's
    ``batch_size`` of 64, 128 or 256 sets how many optimizer steps an epoch takes. Those are
    taken in name order while their choices multiply to at most MAX_KINDS, so that a trial
    still finds its kind at the level below. Other numbers vary from trial to trial."""
    room, numbers = MAX_KINDS, set()
    for name, n in sorted((choices or {}).items()):
        if name in params and not isinstance(params[name], (str, bool)) and n <= room:
            numbers.add(name)
            room //= n
    parts = [f"{k}={v}" for k, v in sorted(params.items())
             if k in numbers or isinstance(v, (str, bool))]
    return ",".join(parts) or POOLED


def pooled_kind(kind: str) -> str:
    """The kind a trial time of ``kind`` has once every trial is one kind (TrialTimes.pooled)."""
    return POOLED + next((end for end in (PER_STEP, ONE_STEP) if kind.endswith(end)), "")


class TrialTimes:
    def __init__(self, reuse: bool) -> None:
        self.reuse = reuse
        self._ended: dict[int, deque[Span]] = {}
        self._seen: dict[int, set[str]] = {}  # worker pid -> kinds it has run
        self._kinds: set[str] = set()  # kinds of the trials that ended

    @property
    def pooled(self) -> bool:
        """Past MAX_KINDS kinds, every trial is one kind for good (module doc)."""
        return len(self._kinds) > MAX_KINDS

    def span(self, gpu: int, worker: int, params: Mapping[str, Any], start: float,
             end: float | None = None, ok: bool = True,
             reports: Sequence[tuple[int, float]] = (),
             choices: Mapping[str, int] | None = None) -> Span:
        """A trial as it runs (``end`` None) or ended; ``reports``: (step, seconds since
        ``start``) of each intermediate value it reported; ``choices``: trial_kind's."""
        raw = trial_kind(params)
        if end is not None and not self.pooled:
            self._kinds.add(raw)
        seen = self._seen.get(worker, set())
        # a running trial that has suggested nothing yet has no kind so far: it warms up
        # only as a new worker's first
        known = bool(params) or end is not None
        return Span(gpu, worker, raw, start, end, first_in_worker=not seen,
                    first_of_kind=raw not in seen if known else not seen, ok=ok,
                    reports=tuple(reports), compare=trial_kind(params, choices))

    def warmup(self, span: Span) -> bool:
        """Did the trial pay its kind's start-up in its worker? (reuse workers only)"""
        return self.reuse and (span.first_in_worker if self.pooled else span.first_of_kind)

    def ended(self, span: Span) -> None:
        self._ended.setdefault(span.gpu, deque(maxlen=_KEPT)).append(span)
        if self.reuse:  # fresh workers run one trial each: nothing to remember
            self._seen.setdefault(span.worker, set()).add(span.kind)

    def measured(self, gpu: int, since: float, running: Iterable[Span],
                 now: float) -> tuple[TrialTime, ...]:
        """The trials that measure the GPU's level set at ``since``: ended ones first, then
        running ones (their time so far)."""
        on_gpu = [s for s in running if s.gpu == gpu]
        spans = [s for s in self._ended.get(gpu, ()) if s.end is not None and s.end >= since]
        warmups = [s for s in (*spans, *on_gpu) if self.warmup(s)]

        def warming_until(w: Span) -> float:
            """A warm-up's start-up is over once it reports a step (module doc)."""
            if w.reports:
                return w.start + min(seconds for _, seconds in w.reports)
            return now if w.end is None else w.end

        def clean(s: Span) -> bool:
            end = now if s.end is None else s.end
            if not s.ok or s.start < since or (self.warmup(s) and not _per_step(s)):
                return False
            return not any(w is not s and w.start < end and warming_until(w) > s.start
                           for w in warmups)

        timed = (self._time(s, now) for s in (*spans, *on_gpu) if clean(s))
        return tuple(t for t in timed if t is not None)

    def _time(self, span: Span, now: float) -> TrialTime | None:
        """What the trial says of its level: seconds per step, or its duration (module doc)."""
        kind, running = POOLED if self.pooled else span.compare or span.kind, span.end is None
        elapsed = (now if span.end is None else span.end) - span.start
        steps = {step for step, _ in span.reports}
        if len(steps) >= 2:
            # the first and last report in time: Optuna takes steps in any order
            (first_s, first), (last_s, last) = (min((s, k) for k, s in span.reports),
                                                max((s, k) for k, s in span.reports))
            if last > first and last_s > first_s:
                # only what it measured between reports, running or ended alike: no tail
                # after the last report (a final evaluation), no guess at the next step
                return TrialTime(f"{kind}{PER_STEP}", (last_s - first_s) / (last - first),
                                 running=running, duration=elapsed)
            return TrialTime(kind, elapsed, running=running)  # steps that do not rise
        if steps:  # one step: only like trials compare; running, it is still on its way
            return None if running else TrialTime(f"{kind}{ONE_STEP}", elapsed)
        return TrialTime(kind, elapsed, running=running)
