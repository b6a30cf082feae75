"""The ``hpo.*`` attribute keys that more than one module writes or reads, each named once.

Optuna user attrs on trials and studies are the orchestrator's contract with SQL, dashboards
and ``status`` (docs/DESIGN.md §2.3 says what each means and when it is written): a key spelt
once here cannot drift between the module that writes it and the ones that read it. A key
used by one module alone stays where it is used. Keys inside SQL text stay literal: a
statement is checked as the text it is (tests/test_db_contract.py). The built-in objectives
set theirs as a user's objective would, by name.
"""

from __future__ import annotations

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
    "SLOT",
    "STARTUP_S",
    "STEP_S",
    "TRACEBACK",
    "WARNING",
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
PRUNER_MIN_RESOURCE_AUTO = "hpo.pruner.min_resource_auto"
# pruner.tune=auto (pruning/_live.py): every switch of the pruner's setting, and the verdict of
# the latest replay (also when it kept the setting: status says why nothing switched)
PRUNER_HISTORY = "hpo.pruner_history"
PRUNER_TUNING = "hpo.pruner_tuning"
