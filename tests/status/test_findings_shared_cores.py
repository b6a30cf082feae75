"""shared_cores: status says when other runs of a host kept busy the cores a study's trials ran
on, from the study attr hpo.shared_cores.<host> (placement/_cores.py), and what to do; an attr
of a shape this package never writes is named, not read (keys.well_formed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo_orchestrator.status._model import Finding
from tests.status.test_findings_idle_gpu import _both

SHARED = {"since": "2026-11-29T13:44:58+00:00", "until": "2026-11-29T13:45:09+00:00", "cores": 2,
          "wanted": 2, "trials": 2,
          "others": [{"pid": 4242, "uid": 1000, "user": "uid 1000 (ann)", "study": "b",
                      "trials": 2, "cores": 2}]}


def _study(url: str, shared: Any) -> None:
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="a")
    study.set_user_attr("hpo.config", {"scheduler": {"parallel": None}})
    study.set_user_attr("hpo.shared_cores.vm", shared)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, params={"x": 0.5},
                                 distributions={"x": FloatDistribution(0, 1)},
                                 user_attrs={"hpo.host": "vm", "hpo.gpu_index": None}))
    storage.engine.dispose()


def _findings(tmp_path: Path, shared: Any) -> list[list[Finding]]:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    _study(url, shared)
    return [report.findings for report in _both(url, "a")]


def test_a_run_that_shared_the_cores_is_named_with_when_and_what_to_do(tmp_path: Path) -> None:
    for findings in _findings(tmp_path, SHARED):  # from a fresh fold and from the kept tally
        [found] = [f for f in findings if f.code == "shared_cores"]
        assert found.message == (
            "host vm, from 2026-11-29T13:44:58+00:00 to 2026-11-29T13:45:09+00:00: another "
            "hpo-orchestrator run (pid 4242, uid 1000 (ann), study 'b') used 2 of the 2 cores the "
            "study's trials ran on, beside the 2 they used: trials shared cores and ran slower")
        assert found.advice == ("give each run its own cores (scheduler.host_cores=1 in each, or "
                                "taskset -c), or run the studies one after the other")
        assert found.evidence == {"hosts": [{"host": "vm", **SHARED}]}


def test_a_sharing_still_going_on_when_its_run_stopped_has_no_end(tmp_path: Path) -> None:
    others = [SHARED["others"][0], {**SHARED["others"][0], "pid": 4343, "study": "c", "cores": 1}]
    [found] = [f for f in _findings(tmp_path, {**SHARED, "until": None, "cores": 1,
                                               "others": others})[0] if f.code == "shared_cores"]
    assert "from 2026-11-29T13:44:58+00:00 on (its end not recorded): 2 other hpo-orchestrator " \
        "runs (pid 4242, uid 1000 (ann), study 'b': 2; pid 4343, uid 1000 (ann), study 'c': 1) " \
        "used 3 of the 1 core " in found.message
    assert "(taskset -c)" in found.advice  # one core for three runs: no share for each


def test_a_shape_we_never_write_is_named_not_read(tmp_path: Path) -> None:
    findings = _findings(tmp_path, {**SHARED, "others": "everyone"})[0]
    assert [f.code for f in findings] == ["unreadable_attr"]
    assert "hpo.shared_cores.vm" in findings[0].message
