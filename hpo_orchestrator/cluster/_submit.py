"""``hpo-orchestrator submit``: one job per node, each one orchestrator, one study.

Every job runs ``hpo-orchestrator run`` with the same overrides on the GPUs its node has; they
share the study through the storage, whose n_trials budget is claimed in a transaction, so
the total stays exact across nodes. What is the study's is checked here, for every engine;
the jobs themselves are the engine's (cluster/_engine.py; Slurm: cluster/slurm/).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace

from rich.console import Console

from hpo_orchestrator.cluster._engine import Engine, Payload
from hpo_orchestrator.config import load_config
from hpo_orchestrator.db.connect import mask_url, sqlite_path
from hpo_orchestrator.errors import ConfigError

__all__ = ["engine_of", "split_overrides", "submit"]


def split_overrides(overrides: list[str], group: str) -> tuple[list[str], list[str]]:
    """(``<group>=...``/``<group>.*`` overrides, the run's overrides)."""
    own = [o for o in overrides if o.split("=", 1)[0] == group or o.startswith(f"{group}.")]
    return own, [o for o in overrides if o not in own]


def engine_of(overrides: list[str], engines: list[Engine]) -> Engine:
    """The engine whose config group the overrides name; the first (Slurm) when none does."""
    named = [e for e in engines if split_overrides(overrides, e.name)[0]]
    if len(named) > 1:
        raise ConfigError(f"overrides of several cluster engines: {', '.join(e.name for e in named)}",
                          "give the keys of one engine only")
    return named[0] if named else engines[0]


def submit(overrides: list[str], dry_run: bool, console: Console, payload: Payload,
           engines: list[Engine]) -> int:
    """Submit one job per node; each calls ``payload(run_overrides, gpus_per_node)(index)``
    there (the CLI passes its ``run``: cli/_node.py)."""
    engine = engine_of(overrides, engines)
    own, run_overrides = split_overrides(overrides, engine.name)
    settings = engine.load(own)
    config = load_config(run_overrides)  # the job runs these: refuse them here, not on a node
    url = config.storage.url
    if config.study.add_trials is not None:
        # Each job resolves "N more" when it starts, and again when it is requeued: the total
        # would depend on when jobs start (docs/CLUSTER.md, "Adding trials").
        raise ConfigError("study.add_trials: each job would add its N counting from its own start "
                          "(and again when requeued), so the study's total would depend on timing",
                          f"give the total instead: study.n_trials=<trials ended so far + "
                          f"{config.study.add_trials}> ('hpo-orchestrator status' shows the count)")
    plan = engine.plan(settings, run_overrides)
    if plan.nodes > 1 and (url.startswith("sqlite") or sqlite_path(url) is not None):
        raise ConfigError(f"storage.url={mask_url(url)}: {plan.nodes} nodes cannot share a sqlite "
                          "file (its locking does not hold over network filesystems)",
                          "use a server database, e.g. storage.url=postgresql+psycopg://user@dbhost/hpo")
    if not any(o.startswith("scheduler.parallel=") for o in run_overrides) and plan.gpus_per_node:
        plan = replace(plan, run_overrides=[*run_overrides,
                                            f"scheduler.parallel={plan.gpus_per_node}"])
    job = payload(plan.run_overrides, plan.gpus_per_node)
    if dry_run:
        sys.stdout.write(engine.dry_run(plan))
        return 0
    done = engine.submit(job, plan)
    study = config.study.name
    console.print(f"submitted {len(done.job_ids)} job(s) to {engine.title}: {' '.join(done.job_ids)} "
                  f"(study {study!r} in {mask_url(url)})", highlight=False, soft_wrap=True)
    console.print(f"watch:  hpo-orchestrator status --storage {shlex.quote(mask_url(url))} "
                  f"--study {shlex.quote(study)} --watch", highlight=False, soft_wrap=True)
    console.print(f"queue:  {done.queue}    stop: {done.stop}    logs: {done.logs}",
                  highlight=False, soft_wrap=True)
    return 0
