"""The cluster engine seam (issue 29, item 6; cluster/_engine.py): ``submit`` checks the
study's side for every engine and hands the jobs to the engine whose config group the
overrides name (Slurm when none does); a second engine needs nothing of Slurm's."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from hpo_orchestrator.cluster import ENGINES, Plan, Submitted
from hpo_orchestrator.cluster._submit import submit
from hpo_orchestrator.errors import ConfigError


@dataclass
class _Settings:
    nodes: int = 1
    gpus: int = 0


class _Kube:
    """A second engine as a new folder would add it: its group is ``kube``."""

    name = "kube"
    title = "Kubernetes"

    def __init__(self) -> None:
        self.sent: list[tuple[Callable[[int], int], Plan]] = []

    def load(self, overrides: list[str]) -> _Settings:
        settings = _Settings()
        for override in overrides:
            key, _, value = override.partition("=")
            setattr(settings, key.removeprefix("kube."), int(value))
        return settings

    def plan(self, settings: _Settings, run_overrides: list[str]) -> Plan:
        return Plan(run_overrides, settings.nodes, settings.gpus, Path("jobs"), settings)

    def dry_run(self, plan: Plan) -> str:
        return f"kind: Job\ncompletions: {plan.nodes}\n"

    def submit(self, payload: Callable[[int], int], plan: Plan) -> Submitted:
        self.sent.append((payload, plan))
        return Submitted([f"hpo-{i}" for i in range(plan.nodes)], "kubectl get jobs",
                         "kubectl delete jobs -l hpo", "kubectl logs")


def _payload(run_overrides: list[str], gpus: int) -> Callable[[int], Any]:
    return lambda index: (run_overrides, gpus, index)


def test_the_engine_named_by_the_overrides_gets_the_jobs(tmp_path: Path) -> None:
    kube = _Kube()
    out = io.StringIO()
    url = f"storage.url=postgresql+psycopg://u@db/{tmp_path.name}"
    code = submit(["kube.nodes=2", "kube.gpus=4", url, "study.n_trials=8"], False,
                  Console(file=out, width=200), _payload, [*ENGINES, kube])
    assert code == 0
    [(job, plan)] = kube.sent
    assert plan.nodes == 2 and plan.gpus_per_node == 4
    assert plan.run_overrides == [url, "study.n_trials=8", "scheduler.parallel=4"]
    assert job(1) == (plan.run_overrides, 4, 1)
    assert "submitted 2 job(s) to Kubernetes: hpo-0 hpo-1" in out.getvalue()
    assert "stop: kubectl delete jobs -l hpo" in out.getvalue()


def test_the_study_side_is_checked_for_every_engine(capsys: pytest.CaptureFixture[str]) -> None:
    kube = _Kube()
    with pytest.raises(ConfigError, match="cannot share a sqlite"):
        submit(["kube.nodes=2", "storage.url=sqlite:///hpo.db"], False, Console(), _payload,
               [*ENGINES, kube])
    assert kube.sent == []
    assert submit(["kube.nodes=1"], True, Console(), _payload, [*ENGINES, kube]) == 0
    assert capsys.readouterr().out == "kind: Job\ncompletions: 1\n" and kube.sent == []
    with pytest.raises(ConfigError, match="several cluster engines"):
        submit(["kube.nodes=1", "slurm.nodes=1"], True, Console(), _payload, [*ENGINES, kube])


def test_slurm_is_the_default_engine() -> None:
    from hpo_orchestrator.cluster._submit import engine_of

    assert engine_of(["study.n_trials=3"], [*ENGINES, _Kube()]).name == "slurm"
    assert engine_of(["kube.nodes=2"], [*ENGINES, _Kube()]).name == "kube"
