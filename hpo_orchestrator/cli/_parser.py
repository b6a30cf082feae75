"""The argument parser of every command (argparse); its errors become ConfigError (exit 2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpo_orchestrator.cli import _artifacts, _first_hour
from hpo_orchestrator.cli._common import DEFAULT_STORAGE
from hpo_orchestrator.errors import ConfigError

# The newest trials (by number) that report draws and tune-pruner replays by default, whatever
# the study's size: on 100k trials, drawing every one took 16 s and replaying every one more
# than 5 minutes; a replay costs 75-90 ms of CPU per trial with the default grid of 114
# settings (docs/BENCHMARKS.md "Read commands on a large study"). --last 0 reads them all.
REPORT_LAST = 5000
TUNE_LAST = 100

__all__ = ["build_parser"]

_RUN_EPILOG = """\
configuration groups (pick one: GROUP=OPTION):
  objective=lightgbm|torch_mlp|custom   pruner={pruners}
  sampler={samplers}

most used keys (KEY=VALUE; --show-config prints them all, with their values):
  study.name=hpo  study.n_trials=40  study.add_trials=N (N more)  study.direction=minimize
  study.directions=[minimize,maximize] (several objectives: objective=custom, no pruning)
  study.fail_fast=5  study.max_failures=null  study.allow_mixed=false
  scheduler.parallel=null  scheduler.gpus=auto  scheduler.trials_per_gpu=null
  scheduler.worker_mode=reuse  scheduler.trial_timeout_s=null  scheduler.log_dir=null
  storage.url=sqlite:///hpo.db  objective.target=pkg.module:function (objective=custom)
  pruner.patience=3  pruner.min_resource=3|auto  sampler.seed=null

e.g. hpo-orchestrator run objective=torch_mlp scheduler.parallel=4 study.n_trials=100
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message, f"see '{self.prog} --help'")

    def format_help(self) -> str:
        """The run's help names the pruner and sampler options config/_search.py has (read
        when the help is shown: every other command starts without the config package)."""
        if self.epilog and "{pruners}" in self.epilog:
            from hpo_orchestrator.config import PRUNERS, SAMPLERS

            self.epilog = self.epilog.replace("{pruners}", "|".join(PRUNERS)).replace(
                "{samplers}", "|".join(SAMPLERS))
        return super().format_help()


class _StudyAsOverride(argparse.Action):
    """``run --study NAME``: status, logs, best and the others take ``--study``; a run names
    its study as an override, which the hint spells out with the name given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        raise ConfigError(f"{parser.prog} takes no {option_string}: a run's study is the "
                          "override study.name", f"{parser.prog} study.name={values}")


def _int_list(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {value!r}") from None
    if not numbers or min(numbers) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {value!r}")
    return numbers


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hpo-orchestrator",
                     description="Optuna HPO on every GPU of this machine.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="run a study (Hydra overrides, e.g. scheduler.parallel=4)",
                              epilog=_RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    run.add_argument("--study", action=_StudyAsOverride, help=argparse.SUPPRESS)
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
    _first_hour.add_logs_parser(commands, DEFAULT_STORAGE)

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
    report.add_argument("--last", type=int, default=REPORT_LAST, metavar="N",
                        help=f"draw the newest N trials (default {REPORT_LAST}; 0: all); "
                             "the summary covers every trial")

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
    tune.add_argument("--last", type=int, default=TUNE_LAST, metavar="N",
                      help=f"replay the newest N trials (default {TUNE_LAST}; 0: all)")
    _add_study_tool_parsers(commands)
    _artifacts.add_artifacts_parser(commands, DEFAULT_STORAGE)
    return parser


class _VersionAction(argparse.Action):
    """``--version``: the installed distribution's version, read when asked (importlib.metadata
    and the scan of the installed distributions took 0.05 s of every command's start)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show the program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stdout.write(f"{parser.prog} {_version()}\n")  # stdout, as argparse's own
        parser.exit()


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
    pick = best.add_mutually_exclusive_group()
    pick.add_argument("--index", type=int, metavar="I",
                      help="several objectives: the Pareto front's I-th trial (0: the first)")
    pick.add_argument("--trial", type=int, metavar="N",
                      help="several objectives: the Pareto front's trial number N")

    enqueue = commands.add_parser("enqueue", help="queue known params: the next run of the "
                                                  "study tries them first")
    enqueue.add_argument("--storage", default=DEFAULT_STORAGE, help=f"default {DEFAULT_STORAGE}")
    enqueue.add_argument("--study", help="study name (optional when the storage has one)")
    enqueue.add_argument("--params", metavar="JSON", help='one set, e.g. \'{"x": 1.5}\'')
    enqueue.add_argument("--file", type=Path, metavar="FILE",
                         help="JSON or YAML: one mapping of params, or a list of them")

