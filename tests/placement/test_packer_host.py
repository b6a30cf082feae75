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
    settled = [{"objective": "custom", "gpu": "H200", "level": 3}]
    study = _Study({here: {**old, "settled": settled}, there: old})
    _packer.forget_packing(study, "here")  # type: ignore[arg-type]
    # the levels this host's runs settled at stay for its next GPU run
    assert study.user_attrs[here] == {"mode": "fixed", "mps": {"active": False}, "levels": [],
                                      "changes": [], "settled": settled}
    assert study.user_attrs[there] == old
    untouched = _Study({there: old})
    _packer.forget_packing(untouched, "here")  # type: ignore[arg-type]
    assert untouched.written == []


# --- one GPU's observation and a group's (what the rules judge) ---------------------------------

def _reading(t: float, util: float | None, used: float | None = None) -> Any:
    from hpo_orchestrator.telemetry._sampler import DeviceReading

    return DeviceReading(t=t, sm_util=util, mem_used_mib=used)


def test_an_observation_holds_the_gpus_numbers_since_its_level_was_set() -> None:
    """Utilization: the mean of the readings that have one, counted; memory free: the total
    less the last reading with a value; host cores: their mean once there are enough rounds;
    steady utilization: the readings since every running trial reported its first step."""
    from hpo_orchestrator.placement import RunningView

    readings = [_reading(1.0, 20.0), _reading(2.0, None), _reading(4.0, 60.0), _reading(6.0, 100.0)]
    latest = [_reading(5.0, 1.0, 3000.0), _reading(6.0, 1.0, 5000.0), _reading(7.0, 1.0, None)]
    running = [RunningView(gpu=3, worker=1, started=1.0, reports=((1, 2.5), (2, 4.0))),
               RunningView(gpu=3, worker=2, started=2.0, reports=((1, 1.5),))]
    obs = _packer.observation(3, 2, readings, latest, 16000.0, (1000.0, 2000.0), ("t",), 1,
                              [1.0, 2.0, 6.0], 3, running)
    assert (obs.gpu, obs.running, obs.readings, obs.util) == (3, 2, 3, 60.0)
    assert obs.free_mib == 11000.0 and obs.running_mem_mib == (1000.0, 2000.0)
    assert (obs.trials, obs.ooms, obs.cpu_cores) == (("t",), 1, 3.0)
    # both trials past their first step from t=3.5: the readings at 4 and 6
    assert (obs.steady_util, obs.steady_readings) == (80.0, 2)
    fewer = _packer.observation(3, 2, readings, latest, 16000.0, (), (), 0, [1.0, 2.0], 3,
                                running)
    assert fewer.cpu_cores is None  # 2 rounds of 3
    unknown = _packer.observation(3, 2, [], [_reading(7.0, 1.0, None)], 16000.0, (), (), 0,
                                  [], 1, [])
    assert (unknown.util, unknown.readings, unknown.free_mib) == (None, 0, None)
    assert (unknown.steady_util, unknown.steady_readings, unknown.cpu_cores) == (None, 0, None)
    no_total = _packer.observation(3, 2, readings, latest, None, (), (), 0, [], 1, running)
    assert no_total.free_mib is None


def _obs(gpu: int, **numbers: Any) -> Any:
    from hpo_orchestrator.placement._rules import GpuObservation

    base: dict[str, Any] = {"running": 2, "util": 50.0, "readings": 10, "free_mib": 8000.0}
    return GpuObservation(gpu=gpu, **{**base, **numbers})


def test_a_groups_observation_is_judged_by_its_tightest_gpu() -> None:
    """Its lowest GPU names it; busy places and readings of the GPU with the least; free
    memory and the running trials' peaks of the GPU with the least room; every GPU's trials
    and OOMs; host cores once (the host's); mean utilization, overall and steady, once known
    on every GPU."""
    a = _obs(2, running=3, util=40.0, readings=12, free_mib=9000.0, running_mem_mib=(1.0,),
             trials=("a",), ooms=1, cpu_cores=4.0, steady_util=30.0, steady_readings=5)
    b = _obs(5, running=2, util=80.0, readings=7, free_mib=3000.0, running_mem_mib=(2.0,),
             trials=("b",), ooms=2, cpu_cores=4.0, steady_util=70.0, steady_readings=4)
    both = _packer._together([a, b])
    assert (both.gpu, both.running, both.readings) == (2, 2, 7)
    assert (both.util, both.steady_util, both.steady_readings) == (60.0, 50.0, 4)
    assert (both.free_mib, both.running_mem_mib) == (3000.0, (2.0,))
    assert (both.trials, both.ooms, both.cpu_cores) == (("a", "b"), 3, 4.0)
    unknown = _packer._together([_obs(2, free_mib=None, util=None, cpu_cores=None,
                                      steady_util=None),
                                 _obs(5, free_mib=3000.0, running_mem_mib=(2.0,),
                                      cpu_cores=6.0, steady_util=70.0)])
    assert (unknown.free_mib, unknown.util, unknown.steady_util) == (None, None, None)
    assert unknown.running_mem_mib == (2.0,)  # the GPU with a known room is the tightest
    assert unknown.cpu_cores is None  # the first GPU's: the host's cores, not summed
    assert _packer._together([a]) is a


# --- what the packer writes of the host, and the threads it gives -------------------------------

_GPUS = [("GPU-1", 1, 80_000), ("GPU-3", 3, 40_000)]


def _packer_on(monkeypatch: pytest.MonkeyPatch, overrides: list[str], mps: bool,
               readings: Any = None) -> Any:
    from hpo_orchestrator.gpu import GpuInfo
    from tests.placement.test_packer import packer_of

    monkeypatch.setattr(_packer, "detect_mps", lambda: {"active": mps, "daemons": []})
    gpus = [GpuInfo(index=i, uuid=u, name="fake", memory_total_mib=m) for u, i, m in _GPUS]
    return packer_of(gpus, ["scheduler.host_cores=16", *overrides], readings)


@pytest.mark.parametrize(("overrides", "mode"), [(["scheduler.parallel=auto"], "auto"),
                                                 (["scheduler.parallel=2"], "fixed")])
def test_the_hosts_entry_says_how_this_run_packs(monkeypatch: pytest.MonkeyPatch,
                                                 overrides: list[str], mode: str) -> None:
    """hpo.packing.<host> (status and report read it): the mode, the policy's target and
    ceiling, the host's cores, MPS, and each GPU's level from the start."""
    packer = _packer_on(monkeypatch, overrides, mps=True)
    entry = packer.study.user_attrs["hpo.packing.h"]
    assert {k: entry[k] for k in ("mode", "target_gpu_util", "max_trials_per_gpu", "cores")} \
        == {"mode": mode, "target_gpu_util": 80.0, "max_trials_per_gpu": 4, "cores": 16}
    assert entry["mps"] == {"active": True, "daemons": []} and entry["changes"] == []
    assert [(lv["gpu"], lv["limit"], lv["held"]) for lv in entry["levels"]] == \
        [(1, 1, None), (3, 1, None)]


def test_fixed_levels_without_mps_write_no_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    packer = _packer_on(monkeypatch, ["scheduler.parallel=2"], mps=False)
    assert "hpo.packing.h" not in packer.study.user_attrs


def test_threads_are_the_cores_share_or_what_the_running_trials_leave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed levels: the host's cores over the trials at once (or the configured count);
    auto: that share within the cores the running trials leave free, never under one."""
    from hpo_orchestrator.placement import RunningView

    fixed = _packer_on(monkeypatch, ["scheduler.parallel=2"], mps=False)
    assert fixed.threads_for_next(()) == 8  # 16 cores, 2 at once
    given = _packer_on(monkeypatch, ["scheduler.parallel=auto", "scheduler.threads_per_trial=3"],
                       mps=False)
    assert given.threads_for_next(()) == 3
    auto = _packer_on(monkeypatch, ["scheduler.parallel=auto"], mps=False)
    held = [RunningView(gpu=1, worker=1, started=0.0, threads=15)]
    assert auto.threads_for_next(held) == 1
    assert auto.threads_for_next([RunningView(gpu=1, worker=1, started=0.0, threads=16)]) == 1
