"""The allocation is the universe: an inherited CUDA_VISIBLE_DEVICES decides which GPUs exist.

The fake GPUs have UUIDs that do not contain their index, and CUDA's default numbering of them
is the reverse of NVML's (see testing/fake_gpu.py), so a mapping that mixes the numberings up
lands on the wrong GPU here.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.gpu import allocate
from hpo_orchestrator.placement import resolve_gpus
from hpo_orchestrator.testing import FakeGpuBackend
from hpo_orchestrator.testing.fake_gpu import FAKE_MACHINE_ENV, fake_uuid
from tests.conftest import trial_rows

TARGET = "objective.target=tests.objectives:"
# A fake machine of its own: other tests' fake-GPU processes on this host would make its GPUs
# look busy (and be skipped).
FOUR = {"HPO_ORCHESTRATOR_FAKE_GPUS": "4", FAKE_MACHINE_ENV: f"allocation-{uuid.uuid4().hex[:8]}"}
PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(("env", "nvml"), [
    ({}, [0, 1, 2, 3]),  # unset: every GPU
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, []),
    ({"CUDA_VISIBLE_DEVICES": "1,3", **PCI}, [1, 3]),
    ({"CUDA_VISIBLE_DEVICES": " 3 , 1 ", **PCI}, [1, 3]),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, [2, 3]),  # fastest first: CUDA 0 is NVML 3
    ({"CUDA_VISIBLE_DEVICES": f"{fake_uuid(2)},{fake_uuid(0)}"}, [0, 2]),
    ({"CUDA_VISIBLE_DEVICES": fake_uuid(1)[:12].lower()}, [1]),  # a unique prefix
])
def test_visible_devices_select_nvml_gpus(env: dict[str, str], nvml: list[int]) -> None:
    backend = allocate(FakeGpuBackend.from_spec("4"), env)
    assert [g.index for g in backend.gpus()] == nvml
    assert len(backend.all_gpus()) == 4
    outside = sorted({0, 1, 2, 3} - set(nvml))
    assert all(backend.sample(i) is None for i in outside)


@pytest.mark.parametrize(("value", "message"), [
    ("7", "GPU 7 does not exist"),
    ("4", "GPU 4 does not exist"),  # counted from 1: the first index past the last GPU
    ("3,4", "GPU 4 does not exist"),
    ("1,x", "'x' is neither a GPU index nor a GPU- UUID"),
    ("GPU-00000000-dead", "GPU GPU-00000000-dead does not exist"),
    ("GPU-", "is the start of 4 GPUs' UUIDs"),
    ("1,1", "GPU 1 is named twice"),
    ("MIG-4f6a1c3e-7b7e-5c3e-9d6a-1a2b3c4d5e6f", "MIG instance, and MIG is not supported"),
])
def test_bad_visible_devices_are_config_errors(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        allocate(FakeGpuBackend.from_spec("4"), {"CUDA_VISIBLE_DEVICES": value, **PCI})
    assert f"CUDA_VISIBLE_DEVICES={value}" in error.value.message


@pytest.mark.parametrize("order", [PCI, {}], ids=["pci", "fastest-first"])
def test_the_last_index_is_one_less_than_the_gpus(order: dict[str, str]) -> None:
    """Indices count from 0 in both orders: 3 is the last of 4 GPUs, 4 names none (a
    ConfigError, exit 2, not an IndexError's traceback)."""
    backend = FakeGpuBackend.from_spec("4")
    last = 3 if order else 0  # fastest first: CUDA's last is NVML 0 on the fake machine
    assert [g.index for g in allocate(backend, {"CUDA_VISIBLE_DEVICES": "3", **order}).gpus()] == [last]
    with pytest.raises(ConfigError, match=r"GPU 4 does not exist .*can use 4 GPU"):
        allocate(backend, {"CUDA_VISIBLE_DEVICES": "4", **order})


def test_indices_on_mixed_gpus_of_unknown_order_are_refused() -> None:
    class MixedNvml(FakeGpuBackend):
        def fastest_first(self) -> None:  # type: ignore[override]
            return None  # as NVML on a host of different GPU models

    mixed = MixedNvml.from_spec("2")
    with pytest.raises(ConfigError, match="index 1 is ambiguous"):
        allocate(mixed, {"CUDA_VISIBLE_DEVICES": "1"})
    assert [g.index for g in allocate(mixed, {"CUDA_VISIBLE_DEVICES": "1", **PCI}).gpus()] == [1]


def test_scheduler_gpus_choose_within_the_allocation() -> None:
    backend = allocate(FakeGpuBackend.from_spec("4"), {"CUDA_VISIBLE_DEVICES": "1,3", **PCI})
    assert [g.index for g in resolve_gpus([3], backend)] == [3]
    with pytest.raises(ConfigError, match=r"GPU 0 is outside this process's allocation, "
                                          r"CUDA_VISIBLE_DEVICES=1,3 \(NVML GPUs 1, 3\)"):
        resolve_gpus([0], backend)


@pytest.mark.slow
@pytest.mark.parametrize(("env", "allocated"), [
    ({"CUDA_VISIBLE_DEVICES": "1,3", **PCI}, [1, 3]),
    ({"CUDA_VISIBLE_DEVICES": f"{fake_uuid(2)[:13]},{fake_uuid(0)}"}, [0, 2]),
], ids=["index", "uuid"])
def test_every_trial_runs_inside_the_allocation(cli, tmp_path: Path, env: dict[str, str],  # type: ignore[no-untyped-def]
                                                allocated: list[int]) -> None:
    env = {**FOUR, **env, "HPO_TEST_STEP_S": "0.1"}
    result = cli("run", "objective=custom", TARGET + "pinned", "scheduler.parallel=4",
                 "study.n_trials=8", "pruner=none", env=env)
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert len(rows) == 8 and all(r["state"] == "COMPLETE" for r in rows)
    assert {r["attrs"]["hpo.gpu_index"] for r in rows} == set(allocated)
    for row in rows:
        attrs = row["attrs"]
        assert attrs["test.cuda_visible_devices"] == fake_uuid(attrs["hpo.gpu_index"])

    status = json.loads(cli("status", "--json", env=env).stdout)
    assert sorted(d["gpu_index"] for d in status["per_device"]) == allocated
    study_attrs = _study_attrs(result.db)
    recorded = [v for k, v in study_attrs.items() if k.startswith("hpo.devices.")]
    assert [[d["index"] for d in devices] for devices in recorded] == [allocated]

    gpus = json.loads(cli("gpus", "--json", env=env).stdout)
    assert [g["index"] for g in gpus["gpus"] if g["allocated"]] == allocated
    assert len(gpus["gpus"]) == 4 and gpus["cuda_visible_devices"] == env["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"CUDA_VISIBLE_DEVICES": "1,3", **PCI}, ["scheduler.gpus=[0]"],
     "error: scheduler.gpus: GPU 0 is outside this process's allocation, CUDA_VISIBLE_DEVICES=1,3"),
    ({"CUDA_VISIBLE_DEVICES": "1,9", **PCI}, [], "error: CUDA_VISIBLE_DEVICES=1,9: GPU 9 does not exist"),
    ({"CUDA_VISIBLE_DEVICES": "4"}, [], "error: CUDA_VISIBLE_DEVICES=4: GPU 4 does not exist"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-1"}, [], "error: CUDA_VISIBLE_DEVICES=MIG-1: MIG-1 is a MIG instance"),
], ids=["outside", "nine", "four", "mig"])
def test_bad_allocation_exits_2_and_writes_nothing(cli, tmp_path: Path, env: dict[str, str],  # type: ignore[no-untyped-def]
                                                   args: list[str], message: str) -> None:
    result = cli("run", "objective=custom", TARGET + "quadratic", "study.n_trials=2", *args,
                 env={**FOUR, **env})
    assert result.code == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith(message) and lines[1].startswith("hint: ")
    assert "Traceback" not in result.stderr and not result.db.exists()


def _study_attrs(db: Path) -> dict[str, object]:
    import sqlite3

    with sqlite3.connect(db) as con:
        return {k: json.loads(v) for k, v in con.execute(
            "SELECT key, value_json FROM study_user_attributes")}
