"""The ``hpo.*`` attribute keys that more than one module writes or reads, each named once,
the shapes of our study attrs, and which trials no orchestrator asked (a rule of the keys).

Optuna user attrs on trials and studies are the orchestrator's contract with SQL, dashboards
and ``status`` (docs/DESIGN.md §2.3 says what each means and when it is written): a key spelt
once here cannot drift between the module that writes it and the ones that read it. A key
used by one module alone stays where it is used. Keys inside SQL text stay literal: a
statement is checked as the text it is (tests/db/test_db_contract.py). The built-in objectives
set theirs as a user's objective would, by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ATTEMPT",
    "CONFIG",
    "DEVICES_PREFIX",
    "DEVICE_CHOICE",
    "DEVICE_CHOICE_PREFIX",
    "ERROR",
    "EXIT_CODE",
    "FAIL_REASON",
    "FIRST_DECISION_S",
    "GPU_ENERGY_J",
    "GPU_INDEX",
    "GPU_MEM_PEAK_MIB",
    "GPU_UTIL_COMPUTE_MEAN",
    "GPU_UTIL_MEAN",
    "GPU_VERIFIED",
    "HOST",
    "LOG_PATH",
    "LOST_RUNS",
    "OPENCL_PLATFORM",
    "ORCHESTRATOR_PID",
    "OVERHEAD_S",
    "PACKING_PREFIX",
    "PARAMS_EFFECTIVE",
    "PARAMS_MISMATCH",
    "PID",
    "PRUNER_HISTORY",
    "PRUNER_MIN_RESOURCE_AUTO",
    "PRUNER_TUNING",
    "RETRIED",
    "RETRY_OF",
    "SETUP_RUNNING",
    "SHARED_CORES_PREFIX",
    "SLOT",
    "STARTUP_S",
    "STEP_S",
    "TRACEBACK",
    "WARNING",
    "asked_outside",
    "well_formed",
]

# asked and spawned (the orchestrator)
HOST = "hpo.host"
PID = "hpo.pid"
SLOT = "hpo.slot"
GPU_INDEX = "hpo.gpu_index"
LOG_PATH = "hpo.log_path"
SETUP_RUNNING = "hpo.setup_running"  # true while its first-wave worker's start-up still runs
ATTEMPT = "hpo.attempt"
ORCHESTRATOR_PID = "hpo.orchestrator_pid"  # with hpo.host at ask(): who asked the trial
RETRY_OF = "hpo.retry_of"  # a retry enqueued by an orchestrator: the trial it retries
LOST_RUNS = "hpo.lost_runs"  # a retry of a lost trial: how often in a row its params were lost

# a trial's end (the orchestrator)
EXIT_CODE = "hpo.exit_code"
FAIL_REASON = "hpo.fail_reason"
ERROR = "hpo.error"
TRACEBACK = "hpo.traceback"
RETRIED = "hpo.retried"
STARTUP_S = "hpo.startup_s"
FIRST_DECISION_S = "hpo.first_decision_s"
OVERHEAD_S = "hpo.overhead_s"
STEP_S = "hpo.step_s"
PARAMS_MISMATCH = "hpo.params_mismatch"
GPU_UTIL_MEAN = "hpo.gpu_util_mean"
GPU_UTIL_COMPUTE_MEAN = "hpo.gpu_util_compute_mean"
GPU_MEM_PEAK_MIB = "hpo.gpu_mem_peak_mib"
GPU_ENERGY_J = "hpo.gpu_energy_j"
GPU_VERIFIED = "hpo.gpu_verified"

# set by the objective (worker/_protocol.py's OBJECTIVE_ATTRS)
PARAMS_EFFECTIVE = "hpo.params_effective"
OPENCL_PLATFORM = "hpo.opencl_platform"
WARNING = "hpo.warning"
DEVICE_CHOICE = "hpo.device_choice"

# on the study
CONFIG = "hpo.config"
DEVICES_PREFIX = "hpo.devices."  # + the host's name
PACKING_PREFIX = "hpo.packing."  # + the host's name
DEVICE_CHOICE_PREFIX = "hpo.device_choice."  # + the host's name
# + the host's name: the latest time other runs of the host shared this study's cores
# (placement/_cores.py)
SHARED_CORES_PREFIX = "hpo.shared_cores."
PRUNER_MIN_RESOURCE_AUTO = "hpo.pruner.min_resource_auto"
# pruner.tune=auto (pruning/_tune_auto.py): every switch of the pruner's setting, and the verdict of
# the latest replay (also when it kept the setting: status says why nothing switched)
PRUNER_HISTORY = "hpo.pruner_history"
PRUNER_TUNING = "hpo.pruner_tuning"


# The shapes of our study attrs, as status and report read them (:func:`well_formed`). Anyone
# who can write the database can write these attrs (``optuna study set-user-attr``, another
# host, a shared .db file): one of a shape we never write is set aside as unreadable, and status
# and report name it, instead of failing on it halfway through a page.

_SECTIONS = ("study", "scheduler", "objective", "pruner", "sampler", "storage", "telemetry")
_CHANGE_KEYS = ("time", "gpu", "from", "to", "reason")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dicts(value: Any, keys: tuple[str, ...] = (), ints: tuple[str, ...] = ()) -> bool:
    """A list of dicts, each with ``keys``, and the ``ints`` among them whole numbers."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and all(k in item for k in keys)
        and all(_is_int(item[k]) for k in ints) for item in value)


def _config(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value[s], dict) for s in _SECTIONS if value.get(s) is not None)


def _devices(value: Any) -> bool:
    return value is None or _dicts(value, ("index",), ("index",))


def _packing(value: Any) -> bool:
    return (isinstance(value, dict)
            and isinstance(value.get("mps") or {}, dict)
            and _dicts(value.get("levels") or [], ("gpu", "limit"), ("gpu",))
            and _dicts(value.get("changes") or [], _CHANGE_KEYS, ("gpu",)))


def _min_resource_auto(value: Any) -> bool:
    return (isinstance(value, dict)
            and all(value.get(k) is None or _is_int(value[k]) for k in ("min_resource", "at_trial"))
            and isinstance(value.get("reason", ""), str))


def _setting(value: Any) -> bool:
    return isinstance(value, dict) and all(
        value.get(k) is None or _is_int(value[k]) for k in ("patience", "min_resource", "reduction_factor"))


def _pruner_history(value: Any) -> bool:
    return _dicts(value, ("time", "old", "new", "evidence")) and all(
        _setting(e["old"]) and _setting(e["new"]) and isinstance(e["evidence"], dict)
        and isinstance(e.get("reason", ""), str) for e in value)


def _pruner_tuning(value: Any) -> bool:
    return (isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("decision", "reason"))
            and _setting(value.get("setting") or {}))


def _device_choice(value: Any) -> bool:
    learners = value.get("learners", {}) if isinstance(value, dict) else None
    return (isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("learner", "reason"))
            and _learner_counts(learners))


def _shared_cores(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("since"), str)
            and all(_is_int(value.get(k)) for k in ("cores", "wanted"))
            and _dicts(value.get("others"), ("pid", "study", "cores"), ("pid", "cores")))


def _learner_counts(value: Any) -> bool:
    """``{"<gpu index>": {"<learner>": count}}``."""
    return isinstance(value, dict) and all(
        isinstance(counts, dict) and all(isinstance(n, str) and _is_int(c) for n, c in counts.items())
        for counts in value.values())


_SHAPES: list[tuple[str, Callable[[Any], bool]]] = [
    (CONFIG, _config), (DEVICES_PREFIX, _devices), (PACKING_PREFIX, _packing),
    (DEVICE_CHOICE_PREFIX, _device_choice), (SHARED_CORES_PREFIX, _shared_cores),
    (PRUNER_MIN_RESOURCE_AUTO, _min_resource_auto),
    (PRUNER_HISTORY, _pruner_history), (PRUNER_TUNING, _pruner_tuning)]


def well_formed(key: str, value: Any) -> bool:
    """Whether ``value`` has the shape we write under ``key`` (a key of no known shape: yes)."""
    for prefix, check in _SHAPES:
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return check(value)
    return True


def asked_outside(attrs: Mapping[str, Any], beats: bool) -> bool:
    """A RUNNING trial that no orchestrator asked (``optuna ask``, a plain ``study.optimize``
    beside the run): none of the attrs an orchestrator writes with the trial's row (or, for
    a retry it enqueued, before) and no heartbeat. Its maker finishes it, not a run: reaping
    leaves it alone and the budget does not wait for it; status shows it as ``outside``."""
    return not beats and all(attrs.get(key) is None for key in (
        HOST, PID, ORCHESTRATOR_PID, RETRY_OF))
