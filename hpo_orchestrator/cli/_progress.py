"""Live progress of a run: a bar with an ETA, the running trials, one line per finished trial,
and for a failed trial the last lines of its log (where the rest is, one command away)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from optuna.trial import TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from hpo_orchestrator.db import ScoredTrial, pareto_front
from hpo_orchestrator.scheduler import FinishedTrial, RunningTrial, read_tail

__all__ = ["LiveReporter"]

_STATE_STYLE = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow", TrialState.FAIL: "red"}
# The bar counts the study's trials that count against n_trials (earlier runs included); the
# text after it says how this run's ended, a re-run attempt (interrupted, retried) apart.
_STATE_LABEL = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}
_LOG_LINES = 6  # log lines shown under a failed trial


class LiveReporter:
    """A context manager; the orchestrator calls ``started``/``finished``/``tick``."""

    def __init__(self, console: Console, n_trials: int, already_done: int,
                 direction: str | Sequence[str], best: tuple[int, float] | None = None,
                 show_logs: bool = True,
                 front: Sequence[tuple[int, tuple[float, ...]]] = ()) -> None:
        self.console = console
        self.directions = [direction] if isinstance(direction, str) else list(direction)
        self.direction = self.directions[0]
        self.best = best  # the study's best, earlier runs included
        # Several objectives have no one best: the study's Pareto front, earlier runs included
        self.front = [ScoredTrial(n, n, v) for n, v in front]
        self.show_logs = show_logs
        # A failed trial's log tail is shown once per error: the next trials failing the same
        # way (fail-fast's five) name the first instead of repeating its traceback.
        self.shown_errors: dict[tuple[str | None, str | None], int] = {}
        self.counts = {TrialState.COMPLETE: 0, TrialState.PRUNED: 0, TrialState.FAIL: 0}
        self.rerun = 0  # this run's attempts whose params run again: not counted
        self.n_trials = n_trials
        self.completed = min(already_done, n_trials)  # the bar: never past the budget
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("this run: {task.description}"), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=console)
        self.task = self.progress.add_task(self._description(), total=n_trials,
                                           completed=self.completed)
        self.running: list[RunningTrial] = []
        self.setup: tuple[int, float] | None = None  # first workers still starting up, since
        self.live = Live(self._render(), console=console, refresh_per_second=4,
                         transient=True)
        self._last_render = 0.0

    def __enter__(self) -> LiveReporter:
        self.live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.live.__exit__(exc_type, exc, tb)
        from hpo_orchestrator.study import StorageLost

        if isinstance(exc, StorageLost):  # its counts are of trials the storage lost
            self.console.print("trials: this run's results are no longer in the storage (the "
                               "error below says where they were saved)", style="yellow",
                               highlight=False)
            return
        self.console.print(self.progress.get_renderable())

    def _description(self) -> str:
        counts = ", ".join(f"[{_STATE_STYLE[s]}]{_STATE_LABEL[s]} {n}[/]"
                          for s, n in self.counts.items())
        if self.rerun:
            counts += f", re-run {self.rerun}"
        if len(self.directions) > 1:
            return counts + f"  Pareto front {len(self.front)} trial(s)"
        best = f"  best {self.best[1]:.6g} (#{self.best[0]})" if self.best else ""
        return counts + best

    def _render(self) -> Group:
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        for column in ("trial", "slot", "elapsed", "phase", "step"):
            table.add_column(column)
        now = time.monotonic()
        for rt in sorted(self.running, key=lambda r: r.slot.id):
            table.add_row(f"#{rt.number}", rt.slot.label, f"{now - rt.spawned_at:.0f}s",
                          "setup still running" if rt.in_setup else rt.phase
                          or ("starting" if rt.started_at is None else "-"),
                          "-" if rt.last_step is None else str(rt.last_step))
        if self.setup is not None and not self.running:
            workers, elapsed = self.setup
            return Group(self.progress.get_renderable(), f"setup still running: {workers} "
                         f"worker(s) importing the objective and running objective.setup "
                         f"({elapsed:.0f}s); the first trials start when they are ready")
        return Group(self.progress.get_renderable(), table)

    def started(self, rt: RunningTrial) -> None:
        self.running.append(rt)

    def finished(self, done: FinishedTrial) -> None:
        if done.retried:
            self.rerun += 1
        else:
            self.counts[done.state] = self.counts.get(done.state, 0) + 1
        value = done.value
        if done.state == TrialState.COMPLETE and value is not None:
            if isinstance(value, tuple):
                # a dominated trial never rejoins the front: the front plus the new one suffices
                self.front = pareto_front([*self.front, ScoredTrial(done.number, done.number,
                                                                    value)], self.directions)
            else:
                self._better(done.number, value)
        style = _STATE_STYLE.get(done.state, "white")
        what = _values_text(done.value) if done.value is not None else (
            f"{done.fail_reason}: {done.error}" if done.fail_reason else "")
        self.console.print(f"[{style}]trial {done.number:>4} {done.state.name:<8}[/] "
                           f"{done.slot:<5} {done.duration_s:6.1f}s  {escape(what)}", highlight=False)
        if done.state == TrialState.FAIL and done.fail_reason != "interrupted" and done.log_path \
                and self.show_logs:
            from pathlib import Path

            first = self.shown_errors.setdefault((done.fail_reason, done.error), done.number)
            if first == done.number:
                for line in read_tail(Path(done.log_path), _LOG_LINES):
                    self.console.print(f"  [dim]| {escape(line)}[/]", highlight=False)
            same = "" if first == done.number else f"  (the same error as trial {first}, shown above)"
            self.console.print(f"  [dim]log: {escape(done.log_path)}{same}[/]", highlight=False)
        if not done.retried and self.completed < self.n_trials:
            self.completed += 1
        self.progress.update(self.task, completed=self.completed, description=self._description())

    def _better(self, number: int, value: float) -> None:
        if self.best is None or (value < self.best[1] if self.direction == "minimize"
                                 else value > self.best[1]):
            self.best = (number, value)

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]note:[/] {escape(text)}", highlight=False)

    def setting_up(self, workers: int, elapsed_s: float) -> None:
        self.setup = (workers, elapsed_s)
        self.tick([])

    def tick(self, running: list[RunningTrial]) -> None:
        self.running = running
        if running:
            self.setup = None
        now = time.monotonic()
        if now - self._last_render >= 0.25:
            self._last_render = now
            self.live.update(self._render())


def _values_text(value: float | tuple[float, ...]) -> str:
    if isinstance(value, tuple):
        return "values " + ", ".join(f"{v:.5g}" for v in value)
    return f"value {value:.5g}"

