"""LightGBM's device choice for a pinned child (docs/DESIGN.md §4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo_orchestrator.gpu._opencl import OpenCLPlatform, choose_lightgbm_device, nvidia_icd_env

POCL = OpenCLPlatform(0, "Portable Computing Language", "The pocl project", 0, 1)
NVIDIA = OpenCLPlatform(1, "NVIDIA CUDA", "NVIDIA Corporation", 1, 1)


def test_nvidia_platform_found_by_name_device_zero() -> None:
    choice = choose_lightgbm_device(True, "auto", "auto", [POCL, NVIDIA])
    assert choice.params == {"device_type": "gpu", "gpu_platform_id": 1, "gpu_device_id": 0}
    assert choice.warning is None and choice.platform == "NVIDIA CUDA"


def test_only_pocl_falls_back_to_cpu_with_warning() -> None:
    choice = choose_lightgbm_device(True, "auto", "auto", [POCL])
    assert choice.params == {"device_type": "cpu"}
    assert choice.warning and "no NVIDIA OpenCL platform" in choice.warning


def test_forced_cpu_platform_is_reported() -> None:
    choice = choose_lightgbm_device(True, "gpu", 0, [POCL, NVIDIA])
    assert choice.params["gpu_platform_id"] == 0
    assert choice.warning and "not an NVIDIA GPU platform" in choice.warning


def test_cpu_slot_trains_on_cpu() -> None:
    assert choose_lightgbm_device(False, "auto", "auto", [NVIDIA]).params == {"device_type": "cpu"}
    with pytest.raises(ValueError, match="slot has no GPU"):
        choose_lightgbm_device(False, "gpu", "auto", [NVIDIA])


def test_icd_registered_when_registry_lacks_nvidia(tmp_path: Path) -> None:
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2\n")
    libdir = tmp_path / "lib64"
    libdir.mkdir()
    (libdir / "libnvidia-opencl.so.1").write_text("")
    env = nvidia_icd_env({}, vendor_dir=str(vendors), library_dirs=(str(libdir),))
    assert env == {"OCL_ICD_FILENAMES": str(libdir / "libnvidia-opencl.so.1")}
    (vendors / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    assert nvidia_icd_env({}, vendor_dir=str(vendors), library_dirs=(str(libdir),)) == {}


def test_no_nvidia_library_no_change(tmp_path: Path) -> None:
    assert nvidia_icd_env({}, vendor_dir=str(tmp_path), library_dirs=(str(tmp_path),)) == {}
