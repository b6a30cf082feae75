"""Real-GPU checks (``pytest -m gpu`` on a host with NVIDIA GPUs; skipped elsewhere)."""

from __future__ import annotations

import pytest

from hpo_orchestrator.gpu import NvmlBackend
from tests.conftest import trial_rows

pytestmark = pytest.mark.gpu


def _gpu_count() -> int:
    opened = NvmlBackend.open()
    return 0 if isinstance(opened, str) else len(opened.gpus())


needs_gpus = pytest.mark.skipif(_gpu_count() < 1, reason="NVML finds no GPU on this machine")
needs_two = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 GPUs")


@needs_two
def test_each_trial_sees_only_its_gpu(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("run", "objective=custom",
                 "objective.target=hpo_orchestrator.testing.objectives:cuda_probe",
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
