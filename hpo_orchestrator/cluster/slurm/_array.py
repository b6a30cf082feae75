"""Slurm as a cluster engine (cluster/_engine.py): one submitit job array, a single sbatch call,
so a refused submission leaves nothing queued; one node and one task per job."""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo_orchestrator.cluster._engine import Plan, Submitted
from hpo_orchestrator.cluster.slurm._config import CPUS_PER_GPU, SlurmConfig, load_slurm_config
from hpo_orchestrator.errors import ConfigError, mask_passwords

__all__ = ["SlurmEngine"]

_PYTHON = shlex.quote(sys.executable)  # the jobs run this interpreter (a shared filesystem)


class SlurmEngine:
    name = "slurm"
    title = "Slurm"

    def load(self, overrides: list[str]) -> SlurmConfig:
        return load_slurm_config(overrides)

    def plan(self, settings: SlurmConfig, run_overrides: list[str]) -> Plan:
        folder = Path(settings.folder).resolve() / f"{settings.job_name}-{uuid.uuid4().hex[:8]}"
        return Plan(run_overrides, settings.nodes, settings.gpus_per_node, folder, settings)

    def dry_run(self, plan: Plan) -> str:
        """The script submitit hands to sbatch. Written by submitit's own (private) function,
        so the dry run shows exactly what a submission sends, without needing Slurm here. Below
        its first line, comments (sbatch reads on past them) say what each job runs (its
        command is submitit's, which unpickles that run) and where the time and cores came
        from."""
        from submitit.slurm.slurm import _make_sbatch_string

        slurm: SlurmConfig = plan.settings
        params = _parameters(slurm)
        if plan.nodes > 1:
            params["map_count"] = plan.nodes  # submitit sets the array size at submission
        command = f"{_PYTHON} -u -m submitit.core._submit {shlex.quote(str(plan.folder))}"
        script = _make_sbatch_string(command=command, folder=plan.folder, **params)
        run = mask_passwords(shlex.join(["hpo-orchestrator", "run", *plan.run_overrides]))
        time_from = " (the default: slurm.time=HH:MM:SS sets it)" \
            if slurm.time == SlurmConfig.time else ""
        cpus_from = f" ({CPUS_PER_GPU} per GPU: slurm.cpus_per_task=N sets it)" \
            if slurm.cpus_per_task is None else ""
        said = [f"# each job runs on its node: {run}",
                f"# --time={slurm.minutes()} minutes{time_from}; "
                f"--cpus-per-task={slurm.cpus()}{cpus_from}"]
        shebang, _, rest = script.partition("\n")
        return "\n".join([shebang, *said, rest])

    def submit(self, payload: Callable[[int], int], plan: Plan) -> Submitted:
        if shutil.which("sbatch") is None or shutil.which("srun") is None:
            raise ConfigError("sbatch is not on PATH: this machine cannot submit Slurm jobs",
                              "run it on a Slurm login node, or print the script with --dry-run")
        import submitit

        executor = submitit.SlurmExecutor(folder=plan.folder, python=_PYTHON)
        executor.update_parameters(**_parameters(plan.settings))
        ids = [j.job_id for j in _submit_array(executor, payload, plan.nodes)]
        array_id = ids[0].split("_", 1)[0]
        return Submitted(ids, f"squeue -j {array_id}", f"scancel {array_id}", str(plan.folder))


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


def _submit_array(executor, job: Callable[[int], int], nodes: int) -> list:  # type: ignore[no-untyped-def,type-arg]
    from submitit.core.utils import FailedJobError

    # submitit prints sbatch's stderr itself; it is passed on below, as one line
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):
            return executor.map_array(job, list(range(nodes)))  # type: ignore[no-any-return]
    except FailedJobError as exc:
        shutil.rmtree(executor.folder, ignore_errors=True)  # its pickles would never run
        with contextlib.suppress(OSError):
            executor.folder.parent.rmdir()  # when this submission created it
        said = [line.split("error:", 1)[1].strip() for line in str(exc).splitlines()
                if "error:" in line] or [str(exc).strip().splitlines()[-1]]
        raise ConfigError(f"sbatch refused the jobs: {said[0]}",
                          "check slurm.partition, slurm.account and the other slurm.* keys "
                          "('sinfo' lists partitions); nothing was submitted") from None
