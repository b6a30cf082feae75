"""A run's layout (GPUs, slots, threads) and its first workers, started before the storage.

A run begins with imports (Optuna, SQLAlchemy, the orchestrator), the objective's check,
the storage and the study; only then could its first workers start, and each worker has its
own start-up (Python, the objective's imports and setup) before its first trial. On an H100
host that made ours enter the first objective 2.25-3.01 s after launch, a plain Optuna
script 0.87-1.06 s (docs/quality/runs.md, "Ours' start-up"). So the run lays out its slots right
after the configuration and starts the first wave then (reuse mode: a worker on each first
slot imports the objective, runs its setup and says ready); the orchestrator adopts the
workers (``Orchestrator(workers=...)``) and waits for them as before. This module imports
neither Optuna nor the orchestrator, so the CLI calls it before those imports.

A run that stops before its loop (a configuration error, a refused storage, a stop signal)
retires the workers and removes the folders it made for them (:meth:`FirstWave.close`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from hpo_orchestrator.artifacts import check_store
from hpo_orchestrator.config import Config
from hpo_orchestrator.db.connect import validated_path
from hpo_orchestrator.gpu import GpuBackend, nvidia_icd_env, open_backend
from hpo_orchestrator.placement import lay_out
from hpo_orchestrator.scheduler._logs import ensure_run_dir, run_dir, sweep_startup_logs
from hpo_orchestrator.scheduler._tree import sweep_left_behind
from hpo_orchestrator.scheduler._workers import Workers, first_imports

__all__ = ["FirstWave"]


class FirstWave:
    """The run's layout and its workers, the first wave among them once :meth:`start` ran.
    ``backend``: the GPUs (default: opened here, closed by :meth:`close`).

    Everything the run would refuse is checked before anything is written: the storage's
    URL and sqlite file (as opening it will check them: a missing folder is the user's error,
    not ours to make), the slots, and the artifact store's folder (``store``: absolute, by
    default in the run folder, so an unusable run folder is refused there too)."""

    def __init__(self, config: Config, backend: GpuBackend | None = None) -> None:
        validated_path(config.storage.url, create=True)
        sched = config.scheduler
        self.log_dir = run_dir(config.storage.url, config.study.name, sched.log_dir)
        self.store = check_store(config.artifacts.store or self.log_dir / "artifacts")
        self.owns_backend = backend is None
        self.backend = open_backend() if backend is None else backend
        try:
            self.layout = lay_out(config, self.backend, self.log_dir)
        except BaseException:
            self._close_backend()
            raise
        # said as early as the slots are known, so that a run started at the same moment
        # sees this one (placement/_cores.py)
        self.layout.cores.announce()
        self.workers = Workers(self.layout.slots, {}, sched.kill_grace_s, nvidia_icd_env(),
                               self.log_dir, first_imports(config.objective))
        self._config = config
        self._made: list[Path] = []  # what start() made: removed by close() unless adopted
        self.adopted = False  # set by the runner once its orchestrator took the workers

    def start(self) -> None:
        """Reuse mode: a worker on each slot of the first wave (as many as the run will start
        at once, and no more than the trials it may start: study.n_trials, or add_trials),
        pinned, threads set, told to start up. What a killed earlier run of the study left
        running is swept first (its records in the run folder)."""
        if self._config.scheduler.worker_mode != "reuse":
            return
        self._made = _missing(self.log_dir)
        ensure_run_dir(self.log_dir)
        sweep_left_behind(self.log_dir)
        sweep_startup_logs(self.log_dir)
        # The budget is read from the storage later; it never exceeds this, and the loop
        # retires a worker it has no trial for, whose start-up then cost CPU for nothing
        # (0.2 s on the 2-core machine, beside the orchestrator's own start-up).
        study = self._config.study
        most = study.n_trials if study.add_trials is None else study.add_trials
        self.workers.start_first_wave(min(self.layout.slots.concurrency, most),
                                      self.layout.threads, self._config.objective)

    def close(self) -> None:
        """Retire the workers still idle (all of them when the run never began; none after a
        loop, which retires its own), give up any wait for a GPU's lease and the run's presence
        on the host's cores, and close the
        backend opened here. A run that stopped before an orchestrator adopted the workers
        also loses the folders :meth:`start` made (with the ``.gitignore`` written beside the
        run folder) where nothing else was written. Never raises for our files: the error that stopped the run
        is the one to report. Safe to call twice."""
        try:
            self.layout.slots.stop_waiting()  # a "waiting" marker in the lease folder
            self.layout.cores.close()  # its presence on the host's cores
            with contextlib.suppress(OSError):
                self.workers.retire_idle()
                self.workers.trees.sweep_all()  # what they started, and its record on disk
            for folder in [] if self.adopted else reversed(self._made):  # deepest first
                with contextlib.suppress(OSError):  # a folder goes only if empty
                    ignore = folder / ".gitignore"  # ensure_run_dir's, in a folder made here
                    if folder == self.log_dir.parent and _names(folder) == [".gitignore"]:
                        ignore.unlink()
                    folder.rmdir()
            self._made = []
        finally:
            self._close_backend()

    def _close_backend(self) -> None:
        if self.owns_backend:
            self.backend.close()
            self.owns_backend = False


def _missing(run_folder: Path) -> list[Path]:
    """The folders ``ensure_run_dir(run_folder)`` will make, outermost first. A link counts
    as there, even one that points nowhere (the user's, to a disk not mounted): never ours
    to remove."""
    return [p for p in (run_folder, *run_folder.parents)
            if not (p.exists() or p.is_symlink())][::-1]


def _names(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir()]
