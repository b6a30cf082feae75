"""Live progress of a run: a bar, the running trials, and one line per finished trial."""

from __future__ import annotations

import time
from types import TracebackType

from optuna.trial import TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hpo_orchestrator.scheduler import FinishedTrial, RunningTrial

__all__ = ["LiveReporter"]

_STATE_STYLE = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow", TrialState.FAIL: "red"}


class LiveReporter:
    """A context manager; the orchestrator calls ``started``/``finished``/``tick``."""

    def __init__(self, console: Console, n_trials: int, already_done: int, direction: str) -> None:
        self.console = console
        self.direction = direction
        self.best: tuple[int, float] | None = None
        self.counts = {TrialState.COMPLETE: 0, TrialState.PRUNED: 0, TrialState.FAIL: 0}
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=console)
        self.task = self.progress.add_task("", total=n_trials, completed=already_done)
        self.running: list[RunningTrial] = []
        self.live = Live(self._render(), console=console, refresh_per_second=4,
                         transient=True)
        self._last_render = 0.0

    def __enter__(self) -> LiveReporter:
        self.live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.live.__exit__(exc_type, exc, tb)
        self.console.print(self.progress.get_renderable())

    def _description(self) -> str:
        counts = " ".join(f"[{_STATE_STYLE[s]}]{s.name.lower()} {n}[/]"
                          for s, n in self.counts.items())
        best = f"  best {self.best[1]:.5g} (#{self.best[0]})" if self.best else ""
        return counts + best

    def _render(self) -> Group:
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        for column in ("trial", "slot", "elapsed", "phase", "step"):
            table.add_column(column)
        now = time.monotonic()
        for rt in sorted(self.running, key=lambda r: r.slot.id):
            table.add_row(f"#{rt.number}", rt.slot.label, f"{now - rt.spawned_at:.0f}s",
                          rt.phase or ("starting" if rt.started_at is None else "-"),
                          "-" if rt.last_step is None else str(rt.last_step))
        return Group(self.progress.get_renderable(), table)

    def started(self, rt: RunningTrial) -> None:
        self.running.append(rt)

    def finished(self, done: FinishedTrial) -> None:
        self.counts[done.state] = self.counts.get(done.state, 0) + 1
        if done.state == TrialState.COMPLETE and done.value is not None:
            better = self.best is None or (done.value < self.best[1] if self.direction == "minimize"
                                           else done.value > self.best[1])
            if better:
                self.best = (done.number, done.value)
        style = _STATE_STYLE.get(done.state, "white")
        what = f"value {done.value:.5g}" if done.value is not None else (
            f"{done.fail_reason}: {done.error}" if done.fail_reason else "")
        self.console.print(f"[{style}]trial {done.number:>4} {done.state.name:<8}[/] "
                           f"{done.slot:<5} {done.duration_s:6.1f}s  {what}", highlight=False)
        self.progress.update(self.task, advance=1, description=self._description())

    def tick(self, running: list[RunningTrial]) -> None:
        self.running = running
        now = time.monotonic()
        if now - self._last_render >= 0.25:
            self._last_render = now
            self.live.update(self._render())
