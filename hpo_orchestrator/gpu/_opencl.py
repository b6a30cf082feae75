"""OpenCL platforms, read through the ICD loader with ctypes (no pyopencl needed).

LightGBM's GPU learner is OpenCL. Its default platform (-1) means "the first one", which on
hosts whose registry lists only PoCL (a CPU implementation) runs the "GPU" training on the
CPU, 40x slower and without an error (docs/DESIGN.md §4). So: register NVIDIA's ICD when the
registry lacks it (:func:`nvidia_icd_env`, applied at spawn, before any OpenCL call), then
pick the platform by name (:func:`list_platforms`, :func:`choose_lightgbm_device`).
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass

__all__ = ["DeviceChoice", "OpenCLPlatform", "choose_lightgbm_device", "list_platforms",
           "nvidia_icd_env"]

_NVIDIA_LIBRARY = "libnvidia-opencl.so.1"
_NVIDIA_LIBRARY_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
                        "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
_VENDOR_DIR = "/etc/OpenCL/vendors"

_CL_PLATFORM_NAME = 0x0902
_CL_PLATFORM_VENDOR = 0x0903
_CL_DEVICE_TYPE_GPU = 1 << 2
_CL_DEVICE_TYPE_ALL = 0xFFFFFFFF


@dataclass(frozen=True)
class OpenCLPlatform:
    id: int
    name: str
    vendor: str
    gpu_devices: int
    all_devices: int

    @property
    def is_nvidia(self) -> bool:
        return "nvidia" in f"{self.name} {self.vendor}".lower()


@dataclass(frozen=True)
class DeviceChoice:
    """LightGBM device params, the platform they point at, and a warning to record if any."""

    params: dict[str, object]
    platform: str | None = None
    warning: str | None = None


def _registered_vendors(vendor_dir: str) -> str:
    text = []
    for path in glob.glob(os.path.join(vendor_dir, "*.icd")):
        try:
            with open(path) as handle:
                text.append(handle.read())
        except OSError:
            continue
    return "\n".join(text).lower()


def nvidia_icd_env(environ: dict[str, str] | None = None, vendor_dir: str = _VENDOR_DIR,
                   library_dirs: tuple[str, ...] = _NVIDIA_LIBRARY_DIRS) -> dict[str, str]:
    """Environment additions that make NVIDIA's OpenCL platform visible to a child.

    Empty when the registry already lists NVIDIA or no NVIDIA OpenCL library exists here.
    ``OCL_ICD_FILENAMES`` is read by both common ICD loaders (ocl-icd and Khronos').
    """
    environ = dict(os.environ if environ is None else environ)
    if "nvidia" in _registered_vendors(vendor_dir):
        return {}
    library = next((os.path.join(d, _NVIDIA_LIBRARY) for d in library_dirs
                    if os.path.exists(os.path.join(d, _NVIDIA_LIBRARY))), None)
    if library is None:
        return {}
    existing = [p for p in environ.get("OCL_ICD_FILENAMES", "").split(":") if p]
    if library in existing:
        return {}
    return {"OCL_ICD_FILENAMES": ":".join([library, *existing])}


def list_platforms() -> list[OpenCLPlatform]:
    """The OpenCL platforms this process sees, in LightGBM's numbering; [] without a loader."""
    try:
        cl = ctypes.CDLL("libOpenCL.so.1")
    except OSError:
        return []
    count = ctypes.c_uint32(0)
    if cl.clGetPlatformIDs(0, None, ctypes.byref(count)) != 0 or count.value == 0:
        return []
    ids = (ctypes.c_void_p * count.value)()
    if cl.clGetPlatformIDs(count.value, ids, None) != 0:
        return []

    def info(platform: ctypes.c_void_p, key: int) -> str:
        buffer = ctypes.create_string_buffer(512)
        if cl.clGetPlatformInfo(platform, key, 512, buffer, None) != 0:
            return ""
        return buffer.value.decode(errors="replace")

    def devices(platform: ctypes.c_void_p, device_type: int) -> int:
        n = ctypes.c_uint32(0)
        status = cl.clGetDeviceIDs(platform, ctypes.c_uint64(device_type), 0, None,
                                   ctypes.byref(n))
        return n.value if status == 0 else 0

    cl.clGetPlatformInfo.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t,
                                     ctypes.c_void_p, ctypes.c_void_p]
    cl.clGetDeviceIDs.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                  ctypes.c_void_p, ctypes.c_void_p]
    return [
        OpenCLPlatform(id=i, name=info(p, _CL_PLATFORM_NAME), vendor=info(p, _CL_PLATFORM_VENDOR),
                       gpu_devices=devices(p, _CL_DEVICE_TYPE_GPU),
                       all_devices=devices(p, _CL_DEVICE_TYPE_ALL))
        for i, p in enumerate(ids)
    ]


def choose_lightgbm_device(on_gpu_slot: bool, device: str, gpu_platform: int | str,
                           platforms: list[OpenCLPlatform]) -> DeviceChoice:
    """LightGBM's device params for a child pinned (or not) to one GPU.

    Inside a pinned child NVIDIA's OpenCL shows only the assigned GPU, so the device is 0 of
    the NVIDIA platform. Never run the GPU learner on a CPU platform without saying so.
    """
    if device == "cpu" or (device == "auto" and not on_gpu_slot):
        return DeviceChoice({"device_type": "cpu"})
    if not on_gpu_slot:
        raise ValueError("objective.device=gpu but this trial's slot has no GPU "
                         "(scheduler.gpus=none or no GPU found)")
    found = ", ".join(f"{p.id}: {p.name}" for p in platforms) or "none"
    if gpu_platform != "auto":
        chosen = next((p for p in platforms if p.id == gpu_platform), None)
        if chosen is None:
            raise ValueError(f"objective.gpu_platform={gpu_platform} does not exist "
                             f"(OpenCL platforms: {found})")
        warning = None
        if not chosen.is_nvidia or chosen.gpu_devices == 0:
            warning = (f"OpenCL platform {chosen.id} ({chosen.name}) is not an NVIDIA GPU "
                       f"platform: LightGBM's GPU learner runs on what it offers, not on the "
                       f"assigned GPU")
        return DeviceChoice({"device_type": "gpu", "gpu_platform_id": chosen.id,
                             "gpu_device_id": 0}, chosen.name, warning)
    nvidia = next((p for p in platforms if p.is_nvidia and p.gpu_devices > 0), None)
    if nvidia is None:
        return DeviceChoice(
            {"device_type": "cpu"}, None,
            f"no NVIDIA OpenCL platform (found: {found}); trained on CPU instead of the "
            f"assigned GPU. Install NVIDIA's OpenCL ICD (libnvidia-opencl.so.1)")
    return DeviceChoice({"device_type": "gpu", "gpu_platform_id": nvidia.id, "gpu_device_id": 0},
                        nvidia.name)
