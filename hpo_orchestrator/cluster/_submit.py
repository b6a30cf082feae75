"""``hpo-orchestrator submit``: one Slurm job per node, each one orchestrator, one study.

The jobs are one submitit job array (a single sbatch call, so a refused submission leaves
nothing queued). Every job runs ``hpo-orchestrator run`` with the same overrides on the GPUs
Slurm gives it; they share the study through the storage, whose n_trials budget is claimed in
a transaction, so the total stays exact across nodes.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from rich.console import Console

from hpo_orchestrator.cluster._config import CPUS_PER_GPU, SlurmConfig, load_slurm_config, split_overrides
from hpo_orchestrator.config import load_config
from hpo_orchestrator.db import mask_url, sqlite_path
from hpo_orchestrator.errors import ConfigError, mask_passwords

__all__ = ["Payload", "submit"]

# What a job runs, made on the submitting machine from the run's overrides and the GPUs per
# node, then pickled by submitit and called with the job's index on its node.
Payload: TypeAlias = Callable[[list[str], int], Callable[[int], int]]

_PYTHON = shlex.quote(sys.executable)  # the jobs run this interpreter (a shared filesystem)


def submit(overrides: list[str], dry_run: bool, console: Console, payload: Payload) -> int:
    """Submit one job per node; each calls ``payload(run_overrides, gpus_per_node)(index)``
    there (the CLI passes its ``run``: cli/_node.py)."""
    slurm_overrides, run_overrides = split_overrides(overrides)
    slurm = load_slurm_config(slurm_overrides)
    config = load_config(run_overrides)  # the job runs these: refuse them here, not on a node
    url = config.storage.url
    if config.study.add_trials is not None:
        # Each job resolves "N more" when it starts, and again when Slurm requeues it: the total
        # would depend on when jobs start (docs/CLUSTER.md, "Adding trials").
        raise ConfigError("study.add_trials: each job would add its N counting from its own start "
                          "(and again when requeued), so the study's total would depend on timing",
                          f"give the total instead: study.n_trials=<trials ended so far + "
                          f"{config.study.add_trials}> ('hpo-orchestrator status' shows the count)")
    if slurm.nodes > 1 and (url.startswith("sqlite") or sqlite_path(url) is not None):
        raise ConfigError(f"storage.url={mask_url(url)}: {slurm.nodes} nodes cannot share a sqlite "
                          "file (its locking does not hold over network filesystems)",
                          "use a server database, e.g. storage.url=postgresql+psycopg://user@dbhost/hpo")
    if not any(o.startswith("scheduler.parallel=") for o in run_overrides) and slurm.gpus_per_node:
        run_overrides = [*run_overrides, f"scheduler.parallel={slurm.gpus_per_node}"]
    folder = Path(slurm.folder).resolve() / f"{slurm.job_name}-{uuid.uuid4().hex[:8]}"
    job = payload(run_overrides, slurm.gpus_per_node)
    if dry_run:
        sys.stdout.write(_sbatch_script(folder, slurm, run_overrides, slurm_overrides))
        return 0
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        raise ConfigError("sbatch is not on PATH: this machine cannot submit Slurm jobs",
                          "run it on a Slurm login node, or print the script with --dry-run")
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, python=_PYTHON)
    executor.update_parameters(**_parameters(slurm))
    jobs = _submit_array(executor, job, slurm)
    ids = [j.job_id for j in jobs]
    array_id = ids[0].split("_", 1)[0]
    study = config.study.name
    console.print(f"submitted {len(ids)} job(s) to Slurm: {' '.join(ids)} "
                  f"(study {study!r} in {mask_url(url)})", highlight=False, soft_wrap=True)
    console.print(f"watch:  hpo-orchestrator status --storage {shlex.quote(mask_url(url))} "
                  f"--study {shlex.quote(study)} --watch", highlight=False, soft_wrap=True)
    console.print(f"queue:  squeue -j {array_id}    stop: scancel {array_id}    "
                  f"logs: {folder}", highlight=False, soft_wrap=True)
    return 0


def _parameters(slurm: SlurmConfig) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters: one node and one task per job, the array's size."""
    params: dict[str, Any] = {
        "job_name": slurm.job_name, "time": slurm.minutes(), "nodes": 1, "ntasks_per_node": 1,
        "cpus_per_task": slurm.cpus(), "array_parallelism": slurm.nodes,
        "additional_parameters": slurm.sbatch_options()}
    if slurm.gpus_per_node:
        params["gpus_per_node"] = slurm.gpus_per_node
    for key in ("partition", "account", "mem"):
        if getattr(slurm, key) is not None:
            params[key] = getattr(slurm, key)
    return params


def _sbatch_script(folder: Path, slurm: SlurmConfig, run_overrides: list[str],
                   slurm_overrides: list[str]) -> str:
    """The script submitit hands to sbatch. Written by submitit's own (private) function, so
    the dry run shows exactly what a submission sends, without needing Slurm here. Below its
    first line, comments (sbatch reads on past them) say what each job runs (its command is
    submitit's, which unpickles that run) and where the time and cores came from."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = _parameters(slurm)
    if slurm.nodes > 1:
        params["map_count"] = slurm.nodes  # submitit sets the array size at submission
    command = f"{_PYTHON} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    script = _make_sbatch_string(command=command, folder=folder, **params)
    run = mask_passwords(shlex.join(["hpo-orchestrator", "run", *run_overrides]))
    typed = {o.split("=", 1)[0].removeprefix("slurm.") for o in slurm_overrides}
    time_from = "" if "time" in typed else " (the default: slurm.time=HH:MM:SS sets it)"
    cpus_from = "" if "cpus_per_task" in typed else \
        f" ({CPUS_PER_GPU} per GPU: slurm.cpus_per_task=N sets it)"
    said = [f"# each job runs on its node: {run}",
            f"# --time={slurm.minutes()} minutes{time_from}; --cpus-per-task={slurm.cpus()}{cpus_from}"]
    shebang, _, rest = script.partition("\n")
    return "\n".join([shebang, *said, rest])


def _submit_array(executor, job: Callable[[int], int], slurm: SlurmConfig) -> list:  # type: ignore[no-untyped-def,type-arg]
    from submitit.core.utils import FailedJobError

    # submitit prints sbatch's stderr itself; it is passed on below, as one line
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):
            return executor.map_array(job, list(range(slurm.nodes)))  # type: ignore[no-any-return]
    except FailedJobError as exc:
        shutil.rmtree(executor.folder, ignore_errors=True)  # its pickles would never run
        with contextlib.suppress(OSError):
            executor.folder.parent.rmdir()  # when this submission created it
        said = [line.split("error:", 1)[1].strip() for line in str(exc).splitlines()
                if "error:" in line] or [str(exc).strip().splitlines()[-1]]
        raise ConfigError(f"sbatch refused the jobs: {said[0]}",
                          "check slurm.partition, slurm.account and the other slurm.* keys "
                          "('sinfo' lists partitions); nothing was submitted") from None
