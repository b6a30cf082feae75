"""Real-GPU checks (``pytest -m gpu`` on a host with NVIDIA GPUs; skipped elsewhere)."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from hpo_orchestrator.gpu import NvmlBackend
from hpo_orchestrator.gpu._opencl import list_platforms, nvidia_icd_env
from tests.conftest import trial_rows

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # real studies on real GPUs


def _gpu_count() -> int:
    opened = NvmlBackend.open()
    return 0 if isinstance(opened, str) else len(opened.gpus())


needs_gpus = pytest.mark.skipif(_gpu_count() < 1, reason="NVML finds no GPU on this machine")
needs_two = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 GPUs")


@needs_two
def test_each_trial_sees_only_its_gpu(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "objective=custom",
                 "objective.target=tests.objectives:cuda_probe",
                 "scheduler.parallel=4", "scheduler.trials_per_gpu=2", "study.n_trials=8",
                 "pruner=none")
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert len(rows) == 8 and all(r["state"] == "COMPLETE" for r in rows), result.stdout
    backend = NvmlBackend.open()
    assert not isinstance(backend, str)
    uuids = {g.index: g.uuid for g in backend.gpus()}
    used = set()
    for row in rows:
        a = row["attrs"]
        gpu = a["hpo.gpu_index"]
        used.add(gpu)
        assert a["test.torch_device_count"] == 1
        assert a["test.nvml_gpus_with_my_pid"] == [gpu]
        assert a["test.torch_uuid"].replace("GPU-", "") in uuids[gpu]
        assert a["test.autocast_dtype"] == "torch.bfloat16"
    assert used == {0, 1}
    report = json.loads(cli("status", "--json").stdout)
    busy = {d["device"]: d["busy_fraction"] for d in report["per_device"]}
    assert busy["gpu0"] > 0.5 and busy["gpu1"] > 0.5, busy


@needs_gpus
def test_lightgbm_trains_on_nvidia_opencl(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "scheduler.parallel=2", "study.n_trials=4", "pruner=none",
                 "objective.device=gpu")
    assert result.code == 0, result.stderr + result.stdout
    for row in trial_rows(result.db):
        a = row["attrs"]
        assert row["state"] == "COMPLETE", a
        assert a["hpo.params_effective"]["device_type"] == "gpu", a
        assert "NVIDIA" in a.get("hpo.opencl_platform", ""), a
        assert "hpo.warning" not in a, a


@needs_two
def test_telemetry_attributes_work_to_the_right_gpu(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "scheduler.parallel=2", "study.n_trials=4", "pruner=none",
                 "objective.device=gpu", "objective.n_rows=400000", "telemetry.interval_s=0.2")
    assert result.code == 0, result.stderr + result.stdout
    rows = trial_rows(result.db)
    first_on_gpu: dict[int, int] = {}
    for row in sorted(rows, key=lambda r: r["number"]):
        first_on_gpu.setdefault(row["attrs"]["hpo.gpu_index"], row["number"])
    for row in rows:
        a = row["attrs"]
        assert row["state"] == "COMPLETE", a
        assert a["hpo.gpu_verified"] is True, a
        assert a["hpo.gpu_util_max"] > 0 and a["hpo.gpu_energy_j"] > 0, a
        assert a["hpo.gpu_mem_peak_mib"] > 0 and a["hpo.gpu_power_mean_w"] > 0, a
        phases = a["hpo.phases"]
        # Building the data set is CPU work: its GPU reading must be lower than training's. Only
        # for a GPU's first trial: NVML's utilization is the busy share of a trailing window
        # (up to 1 s), so a later trial's data phase still sees its predecessor's training
        # (2 x H100, one of 4 trials: data 9.0 % against train 3.8 %).
        if row["number"] == first_on_gpu[a["hpo.gpu_index"]]:
            assert phases["data"]["gpu_util_mean"] < phases["train"]["gpu_util_mean"], phases
    with sqlite3.connect(result.db) as con:
        samples = con.execute("SELECT trial_id, gpu_index, MAX(proc_mem_mib) FROM hpo_telemetry "
                              "GROUP BY trial_id, gpu_index").fetchall()
    gpu_of = {r["trial_id"]: r["attrs"]["hpo.gpu_index"] for r in rows}
    assert sorted(t for t, _, _ in samples) == sorted(gpu_of)  # one GPU per trial: its own
    for trial_id, gpu, proc_mem in samples:
        assert gpu == gpu_of[trial_id] and (proc_mem or 0) > 0
    report = json.loads(cli("status", "--json").stdout)
    util = {d["device"]: d["util_compute_mean"] for d in report["per_device"]}
    assert util["gpu0"] > 0 and util["gpu1"] > 0, util
    assert "gpu_unused" not in {f["code"] for f in report["findings"]}


def _cpu_opencl_platform() -> int | None:
    """The id of a non-NVIDIA OpenCL platform as a pinned child sees them (PoCL on such hosts)."""
    previous = dict(os.environ)
    os.environ.update(nvidia_icd_env())
    try:
        return next((p.id for p in list_platforms() if not p.is_nvidia), None)
    finally:
        os.environ.clear()
        os.environ.update(previous)


@needs_gpus
def test_forced_cpu_opencl_platform_is_reported(cli) -> None:  # type: ignore[no-untyped-def]
    platform = _cpu_opencl_platform()
    if platform is None:
        pytest.skip("this host has no CPU OpenCL platform (PoCL) to force")
    result = cli("run", "scheduler.parallel=1", "study.n_trials=1", "pruner=none",
                 "objective.device=gpu", f"objective.gpu_platform={platform}",
                 "objective.n_rows=20000", "objective.num_boost_round=30",
                 "telemetry.interval_s=0.2")
    assert result.code == 0, result.stderr + result.stdout
    a = trial_rows(result.db)[0]["attrs"]
    assert "not an NVIDIA GPU platform" in a["hpo.warning"], a
    assert a["hpo.gpu_verified"] is False, a
    report = json.loads(cli("status", "--json").stdout)
    unused = [f for f in report["findings"] if f["code"] == "gpu_unused"]
    assert unused and unused[0]["evidence"]["opencl_platforms"], report["findings"]


@needs_gpus
def test_cuda_oom_is_classified_and_retried(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "objective=custom",
                 "objective.target=tests.objectives:cuda_oom_once",
                 "scheduler.parallel=1", "study.n_trials=1", "pruner=none")
    assert result.code == 0, result.stderr + result.stdout
    rows = {r["number"]: r for r in trial_rows(result.db)}
    first, retry = rows[0]["attrs"], rows[1]["attrs"]
    assert rows[0]["state"] == "FAIL" and first["hpo.fail_reason"] == "oom", first
    assert "OutOfMemoryError" in first["hpo.error"] and first["hpo.retried"] is True
    assert rows[1]["state"] == "COMPLETE" and retry["hpo.retry_of"] == 0, retry
    assert retry["hpo.attempt"] == 2 and retry["hpo.retry_reason"] == "oom"


@needs_gpus
def test_a_context_that_does_no_work_is_not_verified(cli) -> None:  # type: ignore[no-untyped-def]
    """NVML lists a process that only holds a context, with no utilization sample for it:
    that must not count as the GPU doing the trial's work (hpo.gpu_verified)."""
    result = cli("run", "objective=custom",
                 "objective.target=tests.objectives:idle_context",
                 "scheduler.parallel=1", "study.n_trials=1", "pruner=none",
                 "telemetry.interval_s=0.2")
    assert result.code == 0, result.stderr + result.stdout
    a = trial_rows(result.db)[0]["attrs"]
    with sqlite3.connect(result.db) as con:
        samples = con.execute("SELECT ts, phase, sm_util, proc_sm_util, proc_mem_mib "
                              "FROM hpo_telemetry ORDER BY ts").fetchall()
    assert a["hpo.telemetry_samples"] >= 5, a
    assert a["hpo.gpu_verified"] is False, samples
