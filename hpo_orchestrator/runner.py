"""The library entry point: :func:`run_study` assembles a run from a validated config and runs it.

``hpo-orchestrator run`` is this plus printing; tests and benchmarks call it in-process::

    from hpo_orchestrator import run_study
    from hpo_orchestrator.config import load_config

    result = run_study(load_config(["study.n_trials=20", "scheduler.parallel=2"]))
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import optuna

from hpo_orchestrator.artifacts import prepare_store
from hpo_orchestrator.config import Config, CustomObjectiveConfig
from hpo_orchestrator.db import best_trial, best_trials, list_studies
from hpo_orchestrator.db.connect import open_rdb_storage, setup_lock, sqlite_path
from hpo_orchestrator.db.tables import ensure_tables
from hpo_orchestrator.errors import ConfigError, RuntimeFailure
from hpo_orchestrator.gpu import GpuBackend, GpuInfo
from hpo_orchestrator.scheduler import Budget, FirstWave, QuietReporter, Reporter
from hpo_orchestrator.scheduler.orchestrator import Orchestrator
from hpo_orchestrator.study import (
    MirrorStorage,
    create_or_load_study,
    enqueue_configured,
    record_config,
    without_pruning,
)
from hpo_orchestrator.tally import advance_tally
from hpo_orchestrator.telemetry import TelemetrySampler

__all__ = ["PreparedRun", "RunResult", "run_study"]

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class PreparedRun:
    """A run assembled and about to start: what the caller may want to show first."""

    config: Config
    gpus: list[GpuInfo]
    slots: int  # slots in the pool
    concurrency: int  # trials at a time
    threads: int  # CPU threads per trial
    parallel_reason: str  # why `concurrency`: scheduler.parallel, or what its default chose
    unavailable_reason: str | None  # why no GPU was found (scheduler.gpus=auto)
    study_name: str
    already_claimed: int  # trials of the study that count in n_trials, claimed by earlier runs
    n_trials: int  # the study's total: study.n_trials, or what study.add_trials made of it
    log_dir: str  # the study's run folder: one log per trial (scheduler/_logs.py)
    best: tuple[int, float] | None = None  # the study's best (number, value) before this run
    # several objectives: the study's Pareto front (number, values) before this run
    front: tuple[tuple[int, tuple[float, ...]], ...] = ()
    recovering: int = 0  # trials a killed run left RUNNING on this host: reaped, run again
    requeued: int = 0  # trials it had asked ahead (no slot took them): back to the queue
    # of already_claimed, the trials still RUNNING that this run leaves to their makers (another
    # orchestrator, `optuna ask`): claimed, not done
    running_elsewhere: int = 0

    @property
    def done_before(self) -> int:
        """Trials of earlier runs that count in n_trials and have ended (or are reaped at this
        run's start): what ``status`` calls finished."""
        return self.already_claimed - self.running_elsewhere

    @property
    def nothing_to_do(self) -> bool:
        """The study already has its n_trials: this run only waits for others' running ones."""
        return self.already_claimed >= self.n_trials


@dataclass(frozen=True)
class RunResult:
    exit_code: int  # 0 done, 1 stopped by the failure policy, 130 stopped by SIGINT/SIGTERM/SIGHUP
    study_name: str
    error: str | None = None  # why the failure policy stopped the run (exit 1)
    hint: str | None = None
    timed_out: bool = False  # study.timeout_s ended the run (exit code 0)
    enqueued: int = 0  # study.enqueue entries added to the study by this run

    @property
    def interrupted(self) -> bool:
        return self.exit_code == EXIT_INTERRUPTED


def check_objective(config: Config) -> None:
    """A custom objective that cannot be imported is a configuration error, found before a
    study is created (ConfigError, exit 2), not in every trial's child."""
    objective = config.objective
    if not isinstance(objective, CustomObjectiveConfig):
        return
    _current_folder_importable()
    cwd, before = os.getcwd(), set(threading.enumerate())
    try:
        _check_targets(objective, cwd)
    finally:
        IMPORT_THREADS.extend(t for t in threading.enumerate() if t not in before and not t.daemon)


def _check_targets(objective: CustomObjectiveConfig, cwd: str) -> None:
    from hpo_orchestrator.worker import import_target

    for key, target in (("objective.target", objective.target), ("objective.setup", objective.setup)):
        if not target:
            continue
        try:
            found = import_target(target)
        except SystemExit as exc:  # at the module's top: the run would end without a word
            raise ConfigError(f"{key}: importing {target!r} called sys.exit({exc.code!r})",
                              "a module's top level runs on import: move that code under "
                              "`if __name__ == \"__main__\":`") from None
        except Exception as exc:
            raise _import_error(key, target, exc) from None
        finally:
            os.chdir(cwd)  # a module that changes folder on import: the run's files stay here
        problem = _not_an_objective(found, takes_trial=key == "objective.target")
        if problem:
            raise ConfigError(f"{key}: {target!r} {problem}", "name a function: module:function"
                              + (" taking the trial" if key == "objective.target" else ""))


def _not_an_objective(found: object, takes_trial: bool) -> str | None:
    """Why ``found`` cannot serve as the objective (called with the trial, returning its
    value) or the setup (called with nothing), or None. Each of these would otherwise fail
    every trial alike, found only after the run had spent them: a class builds an instance,
    a coroutine or generator function returns an object that is no value."""
    if not callable(found):
        return f"is a {type(found).__name__}, not a function"
    if inspect.isclass(found) and takes_trial:
        return ("is a class: called with the trial it builds an instance, not the trial's "
                "value (an instance with __call__(self, trial) in the module does serve)")
    if inspect.iscoroutinefunction(found) or inspect.isasyncgenfunction(found):
        return "is an async function: the run calls it and needs its value, not a coroutine"
    if inspect.isgeneratorfunction(found):
        return "is a generator function (it yields): the run needs the value it returns"
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):  # a builtin or extension without one: call it and see
        return None
    try:
        signature.bind(None) if takes_trial else signature.bind()
    except TypeError:
        takes = "the trial, one argument" if takes_trial else "no argument"
        return f"takes {signature}: it is called with {takes}"
    return None


# Threads the objective's module started on import in this process (a metrics client's, say):
# one that is not a daemon would keep the orchestrator's process alive after its run ends
# (cli/__init__.py: main leaves at once where one is).
IMPORT_THREADS: list[threading.Thread] = []


def _import_error(key: str, target: str, exc: Exception) -> ConfigError:
    """Why ``target`` does not import, with the fix that matches: a syntax error names its
    file and line, an error raised by the module's own code the line that raised it; only a
    module that is not found gets the hint about the current folder and PYTHONPATH."""
    module, _, attribute = target.partition(":")
    what = f"{key}: cannot import {target!r}"
    if isinstance(exc, SyntaxError):  # IndentationError too
        where = f"{exc.filename}:{exc.lineno}"
        line = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
        return ConfigError(f"{what}: {type(exc).__name__} in {where}: {exc.msg}",
                           f"fix the syntax at {where}{line}")
    if isinstance(exc, ModuleNotFoundError) and exc.name and \
            (module == exc.name or module.startswith(exc.name + ".")):
        dotted = _as_module(module)
        if dotted != module:  # a file path where a module name goes
            return ConfigError(f"{what}: {module!r} is a file path, not a module name",
                               f"name it as Python imports it: {key}={dotted}:{attribute or 'objective'}")
        return ConfigError(f"{what} ({type(exc).__name__}: {exc})",
                           f"is the module under the current folder ({os.getcwd()}) or on "
                           "PYTHONPATH, and its name right?")
    if isinstance(exc, AttributeError) and attribute and f"'{attribute}'" in str(exc) \
            and module in sys.modules:
        return ConfigError(f"{what}: module {module!r} has no {attribute!r}",
                           f"the name after ':' is a function of {module} "
                           f"({sys.modules[module].__file__})")
    frames = traceback.extract_tb(exc.__traceback__)
    place = next((f"{f.filename}:{f.lineno}" for f in reversed(frames)
                  if "importlib" not in f.filename), None)
    if isinstance(exc, ModuleNotFoundError):
        return ConfigError(f"{what}: it imports {exc.name!r}, which is not installed"
                           + (f" ({place})" if place else ""),
                           f"install it into this Python ({sys.executable} -m pip install ...)")
    return ConfigError(f"{what}: importing it raised {type(exc).__name__}: {exc}",
                       f"the error is in the module's own code{f' at {place}' if place else ''}; "
                       f"'{sys.executable} -c \"import {module}\"' shows the traceback")


def _as_module(path: str) -> str:
    """``mypkg/trivial.py`` (or ``./mypkg\\trivial.py``) as Python imports it: ``mypkg.trivial``."""
    if "/" not in path and "\\" not in path and not path.endswith(".py"):
        return path
    parts = [p for p in path.replace("\\", "/").removesuffix(".py").split("/") if p not in ("", ".")]
    return ".".join(parts)


def _current_folder_importable() -> None:
    """``objective.target=mypkg.objective:fn`` finds ``./mypkg`` as ``python -m`` would: the
    check here and the children (started with ``python -m``, which puts the current folder
    first on sys.path) import the same module."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _best_so_far(storage: optuna.storages.RDBStorage, study_id: int, directions: list[str]
                 ) -> tuple[tuple[int, float] | None, tuple[tuple[int, tuple[float, ...]], ...]]:
    """The study's best trial before this run (one SQL read: a resume shows the study's best),
    or its Pareto front when it has several objectives."""
    with storage.engine.connect() as connection:
        if len(directions) > 1:
            return None, tuple((t.number, t.values) for t in best_trials(connection, study_id)[1])
        best = best_trial(connection, study_id, directions[0])
    return (None if best is None else (int(best["number"]), float(best["value"]))), ()


def _study_exists(storage: optuna.storages.RDBStorage, name: str) -> bool:
    """Whether the study is still in the storage (True when that cannot be read: then the
    KeyError is not explained by a deletion)."""
    try:
        with storage.engine.connect() as connection:
            return name in list_studies(connection)
    except Exception:
        return True


def run_study(config: Config, *, backend: GpuBackend | None = None,
              progress: Callable[[PreparedRun], AbstractContextManager[Reporter]] | None = None,
              first_wave: FirstWave | None = None) -> RunResult:
    """Run ``config``'s study on this host until n_trials are done (or SIGINT/SIGTERM/SIGHUP).

    ``backend``: the GPUs to use (default: NVML, or the fake one that
    $HPO_ORCHESTRATOR_FAKE_GPUS selects, or none); closed at the end when opened here.
    ``progress``: called once the run is assembled; returns the live reporter (entered for
    the run's length). ``first_wave``: the run's layout and first workers, started by the
    caller before its own imports (the CLI does: scheduler/_first_wave.py); default: started
    here, before the storage. Closed at the end either way. Raises ConfigError (exit 2) and
    RuntimeFailure (exit 1).
    """
    wave = first_wave or FirstWave(config, backend)
    try:
        if first_wave is None:
            wave.start()
        check_objective(config)
        config = without_pruning(config)[0]  # the CLI prints why, before the run starts
        return _run(config, wave, progress)
    finally:
        wave.close()


def _run(config: Config, wave: FirstWave,
         progress: Callable[[PreparedRun], AbstractContextManager[Reporter]] | None) -> RunResult:
    sched = config.scheduler
    # The store's folder, absolute (the children and hpo.config see the same one), checked
    # writable before anything was written (FirstWave); default: the run folder's artifacts/.
    store = wave.store
    config = replace(config, artifacts=replace(config.artifacts, store=str(store)))
    layout, backend = wave.layout, wave.backend
    slots, threads, host = layout.slots, layout.threads, layout.settings.host
    with warnings.catch_warnings():
        # PatientPruner and heartbeats are marked experimental; and Optuna warns that heartbeats
        # are meant for Study.optimize: under ask/tell the orchestrator records them itself.
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        with setup_lock(config.storage.url):  # other orchestrators may be creating it right now
            storage = open_rdb_storage(config.storage.url, config.storage.heartbeat_interval_s,
                                       config.storage.grace_s)
            # Samplers and pruners read a mirror of the study; every write goes to storage.
            mirror = MirrorStorage(storage, max_history=config.sampler.max_history,
                                   keep_best=config.sampler.keep_best,
                                   refresh_s=config.storage.refresh_s)
            study = create_or_load_study(config, mirror, record=False)
            ensure_tables(storage.engine)
            with storage.engine.begin() as connection:  # once per study, then at each trial's end
                advance_tally(connection, study._study_id, study.study_name, rebuild=True)
            enqueued = enqueue_configured(study, config.study.enqueue, config.objective.name,
                                          storage.engine)
        prepare_store(store)  # created once the storage is known good (a refused one: no folder)
        # from here on, transient storage trouble is waited out (storage.retry_s)
        retrying = mirror.start_retrying(config.storage.retry_s)
        budget = Budget(storage.engine, study._study_id, config.study.n_trials,
                        sqlite_path(config.storage.url), retrying,
                        unfinished=lambda: mirror.unfinished_trial_ids(study._study_id))
        claimed = budget.claimed()
        recoverable = budget.recoverable(storage, host, sched.max_retries)
        recovering = recoverable.total
        elsewhere = budget.running_elsewhere(host)
        if config.study.add_trials is not None:  # "N more": the study's total becomes claimed + N
            config = replace(config, study=replace(
                config.study, n_trials=claimed + config.study.add_trials, add_trials=None))
            budget.n_trials = config.study.n_trials
        if claimed - recovering < config.study.n_trials:  # a new study has its record already
            # a run with nothing to run leaves the study's record as it was: its n_trials may
            # be below the trials the study has (study.add_trials raised the total before)
            record_config(study, config)
        best, front = _best_so_far(storage, study._study_id, config.study.objectives)
        prepared = PreparedRun(
            config=config, gpus=layout.gpus, slots=len(slots.slots),
            concurrency=slots.concurrency, threads=threads,
            parallel_reason=layout.parallel_reason,
            unavailable_reason=backend.unavailable_reason,
            study_name=study.study_name,
            already_claimed=claimed - recovering,
            running_elsewhere=elsewhere,
            n_trials=config.study.n_trials,
            recovering=recoverable.lost if claimed - recovering < config.study.n_trials else 0,
            requeued=recoverable.requeued if claimed - recovering < config.study.n_trials else 0,
            log_dir=str(layout.settings.run_folder),
            best=best, front=front)
        live: AbstractContextManager[Reporter] = progress(prepared) if progress is not None \
            else QuietReporter()
        with live as reporter:
            sampler = TelemetrySampler(backend, config.telemetry.interval_s) \
                if config.telemetry.enabled else None
            orchestrator = Orchestrator(config, study, storage, budget, layout, reporter,
                                        sampler, backend, workers=wave.workers)
            wave.adopted = True
            try:
                code = orchestrator.run()
            except KeyError:  # Optuna's storage and ours: "no trial/study with id ..."
                if _study_exists(storage, study.study_name):
                    raise  # a bug of ours: "unexpected ... report it"
                raise RuntimeFailure(
                    f"study {study.study_name!r} was deleted from the storage during the run "
                    "(optuna delete-study, or another program)",
                    "its trials are gone with it; the same command starts it anew") from None
    halted = orchestrator.halted
    return RunResult(exit_code=code, study_name=study.study_name,
                     timed_out=orchestrator.timed_out and code == 0, enqueued=enqueued,
                     error=halted.message if halted else None, hint=halted.hint if halted else None)
