"""What the packer records of the host, from placement/_packer.py's promises: whether CUDA MPS
runs (a daemon by name, or the control pipe in its folder), and that a run without GPU slots
turns an earlier run's packing of this host into a fixed entry without levels (and leaves
another host's alone, and a study without one untouched)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpo_orchestrator.placement import _packer


def _processes(*names: str) -> Any:
    return lambda attrs: [SimpleNamespace(info={"name": n}) for n in names]


@pytest.mark.parametrize("daemons", [["nvidia-cuda-mps-control"], ["nvidia-cuda-mps-server"],
                                     ["nvidia-cuda-mps-server", "nvidia-cuda-mps-control"]])
def test_an_mps_daemon_makes_mps_active_and_is_named(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path, daemons: list[str]) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))  # no control pipe there
    monkeypatch.setattr(_packer.psutil, "process_iter", _processes("python", *daemons, "bash"))
    assert _packer.detect_mps() == {"active": True, "pipe_directory": str(tmp_path),
                                    "daemons": sorted(daemons)}


def test_the_control_pipe_alone_makes_mps_active(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """No daemon seen (another user's, hidden): the control pipe in CUDA_MPS_PIPE_DIRECTORY."""
    (tmp_path / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(_packer.psutil, "process_iter", _processes("python"))
    assert _packer.detect_mps() == {"active": True, "pipe_directory": str(tmp_path),
                                    "daemons": []}
    (tmp_path / "control").unlink()
    assert _packer.detect_mps()["active"] is False


def test_without_a_pipe_folder_the_default_one_is_looked_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(_packer.psutil, "process_iter", _processes())
    looked: list[str] = []
    monkeypatch.setattr(_packer.os.path, "exists", lambda p: looked.append(p) or True)
    assert _packer.detect_mps() == {"active": True, "pipe_directory": None, "daemons": []}
    assert looked == ["/tmp/nvidia-mps/control"]


class _Study:
    def __init__(self, attrs: dict[str, Any]) -> None:
        self.user_attrs = dict(attrs)
        self.written: list[str] = []

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value
        self.written.append(key)


def test_a_run_without_gpu_slots_forgets_this_hosts_packing_only() -> None:
    here, there = _packer.packing_key("here"), _packer.packing_key("there")
    old = {"mode": "auto", "levels": [{"gpu": 0, "level": 3}], "changes": [{"gpu": 0}]}
    study = _Study({here: old, there: old})
    _packer.forget_packing(study, "here")  # type: ignore[arg-type]
    assert study.user_attrs[here] == {"mode": "fixed", "mps": {"active": False}, "levels": [],
                                      "changes": []}
    assert study.user_attrs[there] == old
    untouched = _Study({there: old})
    _packer.forget_packing(untouched, "here")  # type: ignore[arg-type]
    assert untouched.written == []
