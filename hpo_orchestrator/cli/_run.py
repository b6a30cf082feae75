"""``run`` and ``submit``: parse the overrides, start the study, print its progress and summary."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from rich.console import Console

from hpo_orchestrator.cli import _first_hour
from hpo_orchestrator.cli._common import DEFAULT_STORAGE, errors
from hpo_orchestrator.errors import mask_passwords

if TYPE_CHECKING:
    from hpo_orchestrator.config import Config
    from hpo_orchestrator.scheduler import FirstWave

__all__ = ["cmd_run", "cmd_submit"]


def _stopped(again: str) -> str:
    return f"stopped: running trials were marked FAIL (interrupted); {again} to resume"


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """SIGTERM or SIGHUP before the loop runs (Hydra, the study, the mirror) stop the run as
    Ctrl-C does: exit 130 with the stopped run's message, not the signal's 143."""
    from hpo_orchestrator._signals import handling_stop_signals

    totals: list[int] = []  # the study's total as the run resolved it: the loop has begun
    try:
        with handling_stop_signals(), _collector_off_until_the_loop() as loop_begins:
            return _run_command(args, console, totals, loop_begins)
    except KeyboardInterrupt:  # outside the loop, which handles its own stop signals
        message = _stopped("run the same command again") if totals else (
            "stopped before the first trial started; run the same command again to start")
        console.print(message, style="yellow", highlight=False, markup=False)
        return 130


@contextmanager
def _collector_off_until_the_loop() -> Iterator[Callable[[], None]]:
    """The cycle collector off while the run starts up; on again once its loop begins (the
    function yielded), with what start-up made frozen, and at the end whatever happened.

    Start-up makes the process's long-lived objects (Optuna's, SQLAlchemy's, Alembic's and our
    modules: about 110k), which the collector only rescans: 2 full and 270 young collections,
    0.11-0.13 s of the main process's 0.8 s of CPU before the first trial on the 2-core machine
    (docs/quality/runs.md, "Ours' start-up"). Frozen, they stay out of the loop's collections
    too; the price is start-up's own cyclic garbage, about 11k objects, kept until the run
    ends."""
    was_on = gc.isenabled()
    gc.disable()
    frozen = False

    def loop_begins() -> None:
        nonlocal frozen
        if was_on and not gc.isenabled():
            gc.freeze()
            frozen = True
            gc.enable()

    try:
        yield loop_begins
    finally:
        if frozen:  # back to the collector: a caller in-process (tests) keeps no garbage
            gc.unfreeze()
        if was_on:
            gc.enable()


def _run_command(args: argparse.Namespace, console: Console, totals: list[int],
                 loop_begins: Callable[[], None]) -> int:
    from hpo_orchestrator.config import load_config
    from hpo_orchestrator.scheduler import FirstWave

    config = load_config(args.overrides)
    # The first workers start now, before the imports below (Optuna, the orchestrator) and
    # the storage, so their own start-up runs beside ours (scheduler/_first_wave.py).
    wave = None if args.show_config else FirstWave(config)
    try:
        if wave is not None:
            wave.start()
        return _run_study(args, console, totals, config, wave, loop_begins)
    finally:
        if wave is not None:
            wave.close()


def _run_study(args: argparse.Namespace, console: Console, totals: list[int], config: Config,
               wave: FirstWave | None, loop_begins: Callable[[], None]) -> int:
    from contextlib import AbstractContextManager

    import optuna

    from hpo_orchestrator.cli._progress import LiveReporter
    from hpo_orchestrator.config import to_plain_dict
    from hpo_orchestrator.db.connect import create_engine, mask_url
    from hpo_orchestrator.runner import PreparedRun, run_study
    from hpo_orchestrator.scheduler import QuietReporter, Reporter
    from hpo_orchestrator.study import without_pruning

    config, pruning_off = without_pruning(config)
    if pruning_off:
        errors().print(pruning_off, markup=False)
    if args.show_config:
        from omegaconf import OmegaConf  # for its YAML: only here, not on a run's start

        plain = to_plain_dict(config)
        plain["storage"]["url"] = mask_url(plain["storage"]["url"])
        console.print(OmegaConf.to_yaml(plain), highlight=False, markup=False)
        return 0

    def announce(run: PreparedRun) -> AbstractContextManager[Reporter]:
        totals.append(run.n_trials)
        if run.gpus:
            where = ", ".join(f"gpu{g.index} ({g.name})" for g in run.gpus)
            console.print(f"devices: {where}; {run.slots} slots, {run.concurrency} trials at a "
                          f"time ({run.parallel_reason}), {_count(run.threads, 'CPU thread')} each",
                          highlight=False)
        else:
            why = f" ({run.unavailable_reason})" if config.scheduler.gpus == "auto" \
                and run.unavailable_reason else ""
            console.print(f"devices: no GPU{why}; {_count(run.concurrency, 'CPU slot')} "
                          f"({run.parallel_reason}), {_count(run.threads, 'CPU thread')} each",
                          highlight=False)
        console.print(f"study {run.study_name!r} in {mask_url(config.storage.url)}: "
                      f"objective {config.objective.name}, pruner {_pruner_text(config)}, "
                      f"n_trials {run.n_trials} ({run.done_before} done before"
                      f"{_elsewhere(run.running_elsewhere)})",
                      highlight=False, markup=False)
        console.print(f"trial logs: {run.log_dir}", highlight=False, markup=False)
        if run.recovering:
            console.print(f"recovering {run.recovering} trial(s) that a stopped run left running "
                          "on this host: they run again ('status' shows them as lost)",
                          style="yellow", highlight=False, markup=False)
        if run.requeued:  # never ran: not lost, not failed (the README's SQL shows WAITING)
            console.print(f"{run.requeued} trial(s) the stopped run had asked ahead, that no "
                          "slot took, go back to the queue", style="yellow", highlight=False,
                          markup=False)
        if run.nothing_to_do:
            has = f"{run.already_claimed} of its study.n_trials={run.n_trials} trials" \
                if run.already_claimed == run.n_trials else \
                f"{run.already_claimed} trials, more than its study.n_trials={run.n_trials}"
            console.print(
                f"study {run.study_name!r} already has {has}: nothing to run (n_trials counts "
                f"the whole study). For 20 more: "
                f"{_first_hour.run_again(args.overrides, 'study.add_trials=20')}",
                style="yellow", highlight=False, markup=False)
            reporter: AbstractContextManager[Reporter] = QuietReporter()
        else:
            reporter = LiveReporter(console, run.n_trials, run.done_before,
                                    config.study.objectives, best=run.best, front=run.front)
        loop_begins()  # the run's lines are out: its loop comes next
        return reporter

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = run_study(config, progress=announce, first_wave=wave)
    from hpo_orchestrator.status import collect_status, print_status  # not before the first trial

    report = collect_status(create_engine(config.storage.url), result.study_name)
    print_status(report, console,
                 lambda text: _first_hour.as_typed(text, config.storage.url, DEFAULT_STORAGE))
    again = _first_hour.resume_hint(args.overrides, config.study.add_trials,
                                totals[0] if totals else None)
    if result.interrupted:
        console.print(_stopped(again), style="yellow", highlight=False, markup=False,
                      soft_wrap=True)  # a command to copy: never broken across lines
    if result.timed_out:
        console.print(f"time limit reached: study.timeout_s={config.study.timeout_s:g}, no "
                      f"new trial started after it; {again} to continue", highlight=False,
                      markup=False, soft_wrap=True)
    failed = report.last_failed
    console.print(mask_passwords(_first_hour.next_steps(config.storage.url, DEFAULT_STORAGE, failed)),
                  highlight=False, markup=False, soft_wrap=True)
    if result.error:
        errors().print(f"error: {mask_passwords(result.error)}", markup=False)
        if result.hint:
            errors().print("hint: " + mask_passwords(_first_hour.as_typed(
                result.hint, config.storage.url, DEFAULT_STORAGE)), markup=False)
    return result.exit_code


def _pruner_text(config: Any) -> str:
    """The pruner, with its min_resource (``auto``: chosen as trials finish, shown by status)."""
    min_resource = getattr(config.pruner, "min_resource", None)
    if min_resource is None:
        return str(config.pruner.name)
    return f"{config.pruner.name} (min_resource {min_resource})"


def cmd_submit(args: argparse.Namespace, console: Console, main: Callable[[Sequence[str]], int]) -> int:
    """``main`` is the CLI's entry (cli/__init__.py): each job runs it on its node."""
    from hpo_orchestrator.cli._node import NodeRun
    from hpo_orchestrator.cluster import submit

    return submit(args.overrides, args.dry_run, console, partial(NodeRun, main))


def _elsewhere(running: int) -> str:
    """The study's trials running outside this run, which its n_trials already counts."""
    return f", {running} running elsewhere: another run or optuna ask" if running else ""


def _count(n: int, what: str) -> str:
    """'1 CPU slot', '2 CPU slots'."""
    return f"{n} {what}" if n == 1 else f"{n} {what}s"
