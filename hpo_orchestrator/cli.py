"""Command line: ``hpo-orchestrator run|submit|status|logs|best|enqueue|report|tune-pruner|telemetry|gpus``.

The one place that turns an HpoError into ``error: ...`` / ``hint: ...`` and an exit code
(0 done, 1 runtime failure, 2 bad usage or configuration, 130 interrupted). Tracebacks only
with ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from hpo_orchestrator import _cli_trials
from hpo_orchestrator.db import mask_url
from hpo_orchestrator.errors import ConfigError, HpoError

__all__ = ["main"]

DEFAULT_STORAGE = "sqlite:///hpo.db"

_RUN_EPILOG = """\
configuration groups (pick one: GROUP=OPTION):
  objective=lightgbm|torch_mlp|custom   pruner=patient_hyperband|median|none   sampler=tpe|random

most used keys (KEY=VALUE; --show-config prints them all, with their values):
  study.name=hpo  study.n_trials=40  study.add_trials=N (N more)  study.direction=minimize
  study.fail_fast=5  study.max_failures=null  study.allow_mixed=false
  scheduler.parallel=1  scheduler.gpus=auto  scheduler.trials_per_gpu=null
  scheduler.worker_mode=reuse  scheduler.trial_timeout_s=null  scheduler.log_dir=null
  storage.url=sqlite:///hpo.db  objective.target=pkg.module:function (objective=custom)
  pruner.patience=3  pruner.min_resource=3|auto  sampler.seed=null

e.g. hpo-orchestrator run objective=torch_mlp scheduler.parallel=4 study.n_trials=100
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message, f"see '{self.prog} --help'")


def _int_list(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {value!r}") from None
    if not numbers or min(numbers) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {value!r}")
    return numbers


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hpo-orchestrator",
                     description="Optuna HPO on every GPU of this machine.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="run a study (Hydra overrides, e.g. scheduler.parallel=4)",
                              epilog=_RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    run.add_argument("--show-config", action="store_true",
                     help="print the resolved configuration and exit")

    status = commands.add_parser("status", help="state, durations and devices of a study")
    status.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    status.add_argument("--study", help="study name (default: the most recently run)")
    status.add_argument("--trial", type=int, metavar="N",
                        help="one trial: state, params, error, traceback and log file")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--watch", action="store_true", help="refresh every --interval seconds")
    status.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes with --watch (default 2)")
    _cli_trials.add_logs_parser(commands, DEFAULT_STORAGE)

    submit = commands.add_parser("submit", help="run the study as Slurm jobs, one orchestrator per "
                                                 "node (slurm.* and run overrides)")
    submit.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    submit.add_argument("--dry-run", action="store_true", help="print the sbatch script, submit nothing")

    gpus = commands.add_parser("gpus", help="this host's GPUs and which trials hold their slots")
    gpus.add_argument("--json", action="store_true", help="machine-readable output")
    gpus.add_argument("--lease-dir", help="default: $HPO_ORCHESTRATOR_LEASE_DIR or "
                                          "<tmp>/hpo-orchestrator-leases")

    telemetry = commands.add_parser("telemetry", help="a study's GPU/CPU samples as CSV")
    telemetry.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    telemetry.add_argument("--study", help="study name (default: the most recently run)")
    telemetry.add_argument("--trial", type=int, help="only this trial number")
    telemetry.add_argument("--csv", required=True, metavar="FILE", help="output file, - for stdout")

    report = commands.add_parser("report", help="charts of where the study's GPU time went")
    report.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    report.add_argument("--study", help="study name (default: the most recently run)")
    report.add_argument("--out", type=Path, metavar="FILE.html", help="interactive HTML report")
    report.add_argument("--png", type=Path, metavar="FILE.png", help="the same charts as an image")

    tune = commands.add_parser("tune-pruner", help="replay the study's curves through a grid of "
                                                   "pruner settings and recommend one")
    tune.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    tune.add_argument("--study", help="study name (default: the most recently run)")
    tune.add_argument("--json", action="store_true", help="machine-readable output")
    tune.add_argument("--top-k", type=int, default=5, help="best trials that must survive (default 5)")
    tune.add_argument("--patience", type=_int_list, help="grid, e.g. 0,1,2,3,5,8")
    tune.add_argument("--min-resource", type=_int_list, help="grid, e.g. 1,2,3,5,8,13")
    tune.add_argument("--reduction-factor", type=_int_list, help="grid, e.g. 2,3,4")
    tune.add_argument("--all", action="store_true", help="show every setting, not the best 15")
    _add_study_tool_parsers(commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hpo-orchestrator")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_study_tool_parsers(commands: Any) -> None:
    best = commands.add_parser("best", help="the best trial's params, ready to paste as "
                                            "overrides (the Pareto front of a multi-objective study)")
    best.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    best.add_argument("--study", help="study name (default: the most recently run)")
    best.add_argument("--json", action="store_true", help="machine-readable output")

    enqueue = commands.add_parser("enqueue", help="queue known params: the next run of the "
                                                  "study tries them first")
    enqueue.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    enqueue.add_argument("--study", help="study name (optional when the storage has one)")
    enqueue.add_argument("--params", metavar="JSON", help='one set, e.g. \'{"x": 1.5}\'')
    enqueue.add_argument("--file", type=Path, metavar="FILE",
                         help="JSON or YAML: one mapping of params, or a list of them")


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from contextlib import AbstractContextManager

    import optuna
    from omegaconf import OmegaConf

    from hpo_orchestrator.config import load_config, to_plain_dict
    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.progress import LiveReporter, QuietReporter
    from hpo_orchestrator.runner import PreparedRun, run_study
    from hpo_orchestrator.scheduler import Reporter

    config = load_config(args.overrides)
    if args.show_config:
        plain = to_plain_dict(config)
        plain["storage"]["url"] = mask_url(plain["storage"]["url"])
        console.print(OmegaConf.to_yaml(plain), highlight=False, markup=False)
        return 0

    def announce(run: PreparedRun) -> AbstractContextManager[Reporter]:
        if run.gpus:
            where = ", ".join(f"gpu{g.index} ({g.name})" for g in run.gpus)
            console.print(f"devices: {where}; {run.slots} slots, {run.concurrency} trials at a "
                          f"time, {run.threads} CPU threads each", highlight=False)
        else:
            why = f" ({run.unavailable_reason})" if config.scheduler.gpus == "auto" \
                and run.unavailable_reason else ""
            console.print(f"devices: no GPU{why}; {run.concurrency} CPU slots, "
                          f"{run.threads} CPU threads each", highlight=False)
        console.print(f"study {run.study_name!r} in {mask_url(config.storage.url)}: "
                      f"objective {config.objective.name}, pruner {_pruner_text(config)}, "
                      f"n_trials {run.n_trials} ({run.already_claimed} done before)",
                      highlight=False, markup=False)
        console.print(f"trial logs: {run.log_dir}", highlight=False, markup=False)
        if run.nothing_to_do:
            console.print(
                f"study {run.study_name!r} already has {run.already_claimed} of its "
                f"study.n_trials={run.n_trials} trials: nothing to run (n_trials counts the whole "
                f"study). For 20 more: {_cli_trials.run_again(args.overrides, 'study.add_trials=20')}",
                style="yellow", highlight=False, markup=False)
            return QuietReporter()
        return LiveReporter(console, run.n_trials, run.already_claimed, config.study.direction,
                            best=run.best)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = run_study(config, progress=announce)
    from hpo_orchestrator.status import collect_status, print_status  # not before the first trial

    report = collect_status(create_engine(config.storage.url), result.study_name)
    print_status(report, console)
    if result.interrupted:
        console.print("[yellow]stopped: running trials were marked FAIL (interrupted); "
                      "run the same command again to resume[/]")
    if result.timed_out:
        console.print(f"time limit reached: study.timeout_s={config.study.timeout_s:g}, no "
                      "new trial started after it; run the same command again to continue",
                      highlight=False)
    failed = report.last_failed
    console.print(_cli_trials.next_steps(config.storage.url, DEFAULT_STORAGE, failed),
                  highlight=False, markup=False)
    if result.error:
        errors = Console(stderr=True, highlight=False, soft_wrap=True)
        errors.print(f"error: {result.error}", markup=False)
        if result.hint:
            errors.print("hint: " + _cli_trials.as_typed(result.hint, config.storage.url,
                                                         DEFAULT_STORAGE), markup=False)
    return result.exit_code


def _pruner_text(config: Any) -> str:
    """The pruner, with its min_resource (``auto``: chosen as trials finish, shown by status)."""
    min_resource = getattr(config.pruner, "min_resource", None)
    if min_resource is None:
        return str(config.pruner.name)
    return f"{config.pruner.name} (min_resource {min_resource})"


def _cmd_submit(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.cluster import submit

    return submit(args.overrides, args.dry_run, console)


def _cmd_status(args: argparse.Namespace, console: Console) -> int:
    from rich.live import Live

    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.status import collect_status, render_status

    if args.trial is not None:
        return _cli_trials.print_trial(args, console, _errors())
    engine = create_engine(args.storage)
    args.study = _cli_trials.resolve_study(engine, args.study, _errors())
    if args.json:
        print(json.dumps(collect_status(engine, args.study).to_json(), indent=2, default=str))
        return 0
    if not args.watch:
        console.print(render_status(collect_status(engine, args.study)))
        return 0
    with Live(render_status(collect_status(engine, args.study)), console=console,
              auto_refresh=False) as live:
        while True:
            time.sleep(args.interval)
            live.update(render_status(collect_status(engine, args.study)), refresh=True)


def _cmd_gpus(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from hpo_orchestrator.gpu import open_backend
    from hpo_orchestrator.scheduler import LeaseDir, default_lease_dir

    backend = open_backend()
    leases = LeaseDir(default_lease_dir(args.lease_dir))
    rows: list[dict[str, Any]] = []
    allocated = {gpu.index for gpu in backend.gpus()}
    # GPUs outside this process's allocation are listed, but neither read nor offered
    for gpu in backend.all_gpus():
        sample = backend.sample(gpu.index)
        held = leases.holders(gpu.uuid) if gpu.index in allocated else {}
        rows.append({
            "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid,
            "allocated": gpu.index in allocated,
            "util": sample.sm_util if sample else None,
            "mem_used_mib": sample.mem_used_mib if sample else None,
            "mem_total_mib": gpu.memory_total_mib,
            "slots": [{"slot": k, **holder} for k, holder in sorted(held.items())]})
    backend.close()
    if args.json:
        print(json.dumps({"lease_dir": str(leases.path), "allocation": backend.describe(),
                          "cuda_visible_devices": backend.source, "gpus": rows,
                          "unavailable_reason": backend.unavailable_reason}, indent=2))
        return 0
    if not rows:
        console.print(f"no GPU: {backend.unavailable_reason or 'none found'}", highlight=False)
        return 0
    title = f"GPUs (slot leases in {leases.path})"
    if backend.restricted:
        title += f"; this process may use {backend.describe()}"
    table = Table(title=title, title_justify="left")
    for column in ("gpu", "name", "util", "memory MiB", "held slots"):
        table.add_column(column)
    for row in rows:
        memory = "-" if row["mem_used_mib"] is None else (
            f"{row['mem_used_mib']:.0f} / {row['mem_total_mib']:.0f}" if row["mem_total_mib"]
            else f"{row['mem_used_mib']:.0f}")
        holders = "\n".join(
            f"{h['slot']}: study {h.get('study', '?')} trial {h.get('trial', '?')} "
            f"(pid {h.get('trial_pid', '?')}, orchestrator {h.get('pid', '?')} on {h.get('host', '?')})"
            for h in row["slots"]) or ("free" if row["allocated"] else "not allocated")
        table.add_row(str(row["index"]), row["name"], "-" if row["util"] is None else f"{row['util']:.0f}%",
                      memory, holders)
    console.print(table)
    return 0


def _cmd_telemetry(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.telemetry._export import export_csv

    engine = create_engine(args.storage)
    count = export_csv(engine, _cli_trials.resolve_study(engine, args.study, _errors()), args.trial,
                       args.csv)
    if args.csv != "-":
        Console(stderr=True).print(f"wrote {count} samples to {args.csv}", highlight=False)
    return 0


def _cmd_report(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.report import write_report

    engine = create_engine(args.storage)
    data = write_report(engine, _cli_trials.resolve_study(engine, args.study, _errors()), args.out,
                        args.png)
    written = " and ".join(str(p) for p in (args.out, args.png) if p is not None)
    console.print(f"wrote {written}: study {data.study!r}, {len(data.bars)} trials on "
                  f"{len({lane.rsplit(' #', 1)[0] for lane in data.lanes})} device(s)",
                  highlight=False)
    return 0


def _cmd_tune_pruner(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.pruning import default_grid, load_curves, recommend, tune
    from hpo_orchestrator.pruning._render import LIMITS, render_tuning

    if args.top_k < 1:
        raise ConfigError(f"--top-k: expected an integer >= 1, got {args.top_k}", "e.g. --top-k 5")
    if (args.min_resource and min(args.min_resource) < 1) or (args.reduction_factor and \
            min(args.reduction_factor) < 2):
        raise ConfigError("--min-resource takes integers >= 1 and --reduction-factor integers >= 2",
                          "e.g. --min-resource 1,3,5 --reduction-factor 2,3")
    engine = create_engine(args.storage)
    curves = load_curves(engine, _cli_trials.resolve_study(engine, args.study, _errors()))
    grid = default_grid(curves.full_step, args.patience, args.min_resource, args.reduction_factor)
    results = tune(curves, grid, args.top_k)
    choice, reason = recommend(results)
    if args.json:
        print(json.dumps({"study": curves.study, "direction": curves.direction,
                          "full_step": curves.full_step, "limits": LIMITS,
                          "recommendation": {**choice.to_json(), "reason": reason},
                          "results": [r.to_json() for r in results]}, indent=2))
        return 0
    console.print(render_tuning(curves, results, choice, reason, None if args.all else 15))
    return 0


def _errors() -> Console:
    """stderr: never wrapped, so an error line stays one line in a log or a pipe."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _console() -> Console:
    """stdout. A terminal gets rich's layout at its width; a pipe or file is not hard-wrapped
    at 80 columns (lines stay whole; tables take the width they need)."""
    probe = Console()
    if probe.is_terminal or "COLUMNS" in os.environ:
        return probe
    return Console(width=200, soft_wrap=True)


def _cmd_best(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.db import create_engine
    from hpo_orchestrator.study_tools import enqueue_command, find_best, override_line

    engine = create_engine(args.storage)
    best = find_best(engine, _cli_trials.resolve_study(engine, args.study, _errors()))
    if args.json:
        print(json.dumps(best.to_json(), indent=2))
        return 0
    directions = ", ".join(best.directions)
    if not best.trials:
        console.print(f"study {best.study!r} ({directions}): no COMPLETE trial yet", highlight=False)
        return 0
    several = len(best.directions) > 1
    console.print(f"study {best.study!r} ({directions}): " + (
        f"Pareto front, {len(best.trials)} trial(s)" if several else
        f"best trial #{best.trials[0].number}, value {best.trials[0].values[0]!r}"), highlight=False)
    for trial in best.trials:
        if several:
            values = ", ".join(repr(v) for v in trial.values)
            console.print(f"\ntrial #{trial.number}: values {values}", highlight=False)
        width = max((len(n) for n in trial.params), default=0)
        for name, value in trial.params.items():
            console.print(f"  {name:<{width}}  {value!r}", highlight=False, markup=False)
        line = override_line(trial.params, best.objective)
        if line:
            console.print(f"overrides: {line}", highlight=False, markup=False, soft_wrap=True)
        console.print(f"enqueue:   {enqueue_command(best.study, trial.params)}", highlight=False,
                      markup=False, soft_wrap=True)
    return 0


def _cmd_enqueue(args: argparse.Namespace, console: Console) -> int:
    from hpo_orchestrator.study_tools import enqueue_params, load_params

    done = enqueue_params(args.storage, args.study, load_params(args.params, args.file))
    added = ", ".join(f"#{n}" for n in done.added) or "none"
    console.print(f"study {done.study!r}: enqueued {len(done.added)} trial(s) ({added}) as WAITING"
                  + (f"; {done.skipped} already in the study, skipped" if done.skipped else ""),
                  highlight=False)
    if done.added and done.n_trials is not None and done.claimed >= done.n_trials:
        console.print(f"the study's budget is spent ({done.claimed} of study.n_trials="
                      f"{done.n_trials} trials ended): run it with a higher study.n_trials to "
                      f"try them", highlight=False)
    elif done.added:
        console.print("the next run of the study tries them first (they count against "
                      "study.n_trials once they run)", highlight=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    console = _console()
    errors = _errors()
    command = None
    try:
        args = _parser().parse_args(argv)
        command = args.command
        commands = {"run": _cmd_run, "status": _cmd_status, "telemetry": _cmd_telemetry,
                    "gpus": _cmd_gpus, "report": _cmd_report, "submit": _cmd_submit,
                    "tune-pruner": _cmd_tune_pruner, "best": _cmd_best, "enqueue": _cmd_enqueue,
                    "logs": lambda a, c: _cli_trials.cmd_logs(a, c, errors)}
        return commands[command](args, console)
    except HpoError as exc:
        if debug:
            raise
        errors.print(f"error: {exc.message}", markup=False)
        if exc.hint:
            errors.print(f"hint: {exc.hint}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `status --json | head`: the reader left
        if command in ("status", "telemetry", "gpus", "report", "tune-pruner", "best", "logs"):
            sys.stderr.close()
            return 0
        if debug:
            raise
        errors.print("error: unexpected BrokenPipeError (stdout closed?)", markup=False)
        return 1
    except Exception as exc:
        if debug:
            raise
        errors.print(f"error: unexpected {type(exc).__name__}: {exc}", markup=False)
        errors.print("hint: run again with --debug for the traceback, and report it", markup=False)
        return 1

