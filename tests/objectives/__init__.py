"""Small objectives for tests and benchmarks (scripts/bench_*.py), importable in child
processes as ``tests.objectives:NAME`` with the checkout's root on the path (tests/conftest.py
puts it on PYTHONPATH; the benchmarks run from the checkout)."""

from __future__ import annotations

import gc
import os
import sys
import time
from datetime import datetime
from typing import Any

import optuna

from hpo_orchestrator.worker import phase, phase_depth, slot_info
from tests.misbehaving import chaos  # objectives:chaos, as the tests name it

# The cycle collector's state when a trial's process imports its objective (Optuna and ours
# were imported by then): worker/__main__.py, tests/worker/test_worker_collector.py.
_COLLECTOR_AT_IMPORT = (gc.isenabled(), gc.get_freeze_count(),
                        [generation["collections"] for generation in gc.get_stats()])

__all__ = ["chaos", "chatty", "collections_so_far", "cuda_oom_once", "cuda_probe", "curves", "gated",
           "import_order", "low_cpu", "oom_when_shared", "phased", "pinned", "quadratic", "ranged",
           "reports10", "reuse_probe", "rising", "shared_gpu", "siblings", "sleepy", "slow_setup",
           "slow_start", "stamped", "two_objectives"]


def quadratic(trial: Any) -> float:
    x = trial.suggest_float("x", -2.0, 2.0)
    return (x - 0.5) ** 2


def two_objectives(trial: Any) -> tuple[float, float]:
    """Loss and cost that pull apart (every x in [0, 2] is Pareto-optimal for minimize,
    minimize), written for pruning as one objective's code is: a multi-objective study runs it
    unchanged."""
    x = trial.suggest_float("x", 0.0, 2.0)
    for step in range(3):
        trial.report(x + step, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return x ** 2, (x - 2.0) ** 2


def pinned(trial: Any) -> float:
    """Records what this process was pinned to, and overlaps with other trials for a while."""
    trial.set_user_attr("test.cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES"))
    trial.set_user_attr("test.cuda_device_order", os.environ.get("CUDA_DEVICE_ORDER"))
    x = trial.suggest_float("x", -1.0, 1.0)
    with phase("train"):
        for step in range(1, 4):
            time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.3")))
            trial.report(x * x + 1.0 / step, step)
    return x * x


def low_cpu(trial: Any) -> float:
    """A GPU trial that uses almost no host CPU (it waits, as a trial waits for its GPU
    kernels), reporting a step every ``HPO_TEST_STEP_S`` seconds (default 0.4) for 12 steps;
    it records when it started and ended (``test.t0``, ``test.t1``: time.time()) so that a
    test can tell which trials ran at the same time."""
    trial.set_user_attr("test.t0", time.time())
    x = trial.suggest_float("x", 0.0, 1.0)
    step_s = float(os.environ.get("HPO_TEST_STEP_S", "0.4"))
    for step in range(1, 13):
        time.sleep(step_s)
        trial.report(x + 1.0 / step, step)
    trial.set_user_attr("test.t1", time.time())
    return x


_started_up = False  # this process paid slow_start's start-up


def slow_start(trial: Any) -> float:
    """A GPU trial with a cold start: the first trial of each process spends
    ``HPO_TEST_STARTUP_S`` seconds (default 6) without touching its GPU (imports, data, CUDA
    context), then every trial works its fake GPU (``$HPO_FAKE_GPU_WORK_DIR/<pid>``) for 5
    steps of ``HPO_TEST_STEP_S`` (default 0.2). It records its start, its first report and its
    end (``test.t0``, ``test.first_step``, ``test.t1``: time.time())."""
    global _started_up
    trial.set_user_attr("test.t0", time.time())
    x = trial.suggest_float("x", 0.0, 1.0)
    if not _started_up:
        time.sleep(float(os.environ.get("HPO_TEST_STARTUP_S", "6")))
        _started_up = True
    marker = os.path.join(os.environ["HPO_FAKE_GPU_WORK_DIR"], str(os.getpid()))
    open(marker, "w").close()
    try:
        for step in range(1, 6):
            time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.2")))
            if step == 1:
                trial.set_user_attr("test.first_step", time.time())
            trial.report(x + 1.0 / step, step)
    finally:
        os.unlink(marker)
    trial.set_user_attr("test.t1", time.time())
    return x


def stamped(trial: Any) -> float:
    """Writes the wall-clock time of its start and of each report to
    ``$HPO_TEST_STAMPS/<number>.txt`` ("start T", then "STEP T" per report): the durations the
    database stores are checked against what the trial itself saw. ``HPO_TEST_STEPS`` reports
    (default 1000) of ``HPO_TEST_STEP_S`` seconds (default 0.2)."""
    path = os.path.join(os.environ["HPO_TEST_STAMPS"], f"{trial.number}.txt")
    step_s = float(os.environ.get("HPO_TEST_STEP_S", "0.2"))
    x = trial.suggest_float("x", -1.0, 1.0)
    with open(path, "a", buffering=1) as stamps:
        stamps.write(f"start {time.time()!r}\n")
        for step in range(1, int(os.environ.get("HPO_TEST_STEPS", "1000")) + 1):
            time.sleep(step_s)
            stamps.write(f"{step} {time.time()!r}\n")  # before the report: it cannot be later
            trial.report(x * x + 1.0 / step, step)
    return x * x


def ranged(trial: Any) -> float:
    """``x`` in [-1, HPO_TEST_X_HIGH] (default 1), or one of two choices with
    HPO_TEST_X_KIND=categorical: a search space edited between two runs of one study."""
    if os.environ.get("HPO_TEST_X_KIND") == "categorical":
        return float(trial.suggest_categorical("x", [0, 1]))
    x = trial.suggest_float("x", -1.0, float(os.environ.get("HPO_TEST_X_HIGH", "1")))
    return x * x


def curves(trial: Any) -> float:
    """Learning curves whose level is set by ``x``: bad trials are easy to prune. Steps take
    ``HPO_TEST_STEP_S`` seconds (default 0.02)."""
    x = trial.suggest_float("x", 0.0, 1.0)
    step_s = float(os.environ.get("HPO_TEST_STEP_S", "0.02"))
    value = 0.0
    for step in range(1, 11):
        value = x + 1.0 / step
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
        time.sleep(step_s)
    return value


def rising(trial: Any) -> float:
    """As :func:`curves`, except that trials with ``x >= 0.5`` get worse at every step from
    the first: a pruner with less patience stops them sooner (pruner.tune=auto's end-to-end
    test). Steps take ``HPO_TEST_STEP_S`` seconds (default 0.02)."""
    x = trial.suggest_float("x", 0.0, 1.0)
    step_s = float(os.environ.get("HPO_TEST_STEP_S", "0.02"))
    value = 0.0
    for step in range(1, 11):
        value = x + 1.0 / step if x < 0.5 else 1.0 + x + 0.05 * step
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
        time.sleep(step_s)
    return value


def phased(trial: Any) -> float:
    """A data phase without GPU work, a training phase with it, then validation.

    With the fake GPU backend, the training phase "works" on the GPU by creating the marker
    file ``$HPO_FAKE_GPU_WORK_DIR/<pid>`` (see hpo_orchestrator/gpu/_fake.py).
    """
    x = trial.suggest_float("x", 0.0, 1.0)
    step_s = float(os.environ.get("HPO_TEST_STEP_S", "0.5"))
    with phase("data"):
        time.sleep(2 * step_s)
    work_dir = os.environ.get("HPO_FAKE_GPU_WORK_DIR")
    marker = os.path.join(work_dir, str(os.getpid())) if work_dir else None
    with phase("train"):
        if marker:
            open(marker, "w").close()
        try:
            for step in range(1, 4):
                deadline = time.monotonic() + step_s
                while time.monotonic() < deadline:  # real CPU work, so cpu_util is not 0
                    sum(i * i for i in range(1000))
                trial.report(x + 1.0 / step, step)
                trial.should_prune()
        finally:
            if marker:
                os.unlink(marker)
    with phase("validate"):
        time.sleep(step_s)
    return x


def shared_gpu(trial: Any) -> float:
    """Trials that work on one fake GPU at the same time, each at its own SM share.

    Trial n writes ``10 * (n + 1)`` into its marker file (the fake GPU reports that as the
    process's utilization), then waits until ``HPO_TEST_SHARERS`` markers exist, so that every
    sample of its training phase is taken while the others work too.
    """
    work_dir = os.environ["HPO_FAKE_GPU_WORK_DIR"]
    sharers = int(os.environ.get("HPO_TEST_SHARERS", "2"))
    marker = os.path.join(work_dir, str(os.getpid()))
    with phase("train"):
        with open(marker + ".tmp", "w") as handle:
            handle.write(str(10.0 * (trial.number + 1)))
        os.replace(marker + ".tmp", marker)  # the fake never reads a half-written file
        try:
            deadline = time.monotonic() + 60
            while sum(name.isdigit() for name in os.listdir(work_dir)) < sharers \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            for step in range(1, 4):
                time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.3")))
                trial.report(1.0 / step, step)
        finally:
            os.unlink(marker)
    return float(trial.number)


def sleepy(trial: Any) -> float:
    """Sleeps long enough to be interrupted."""
    trial.suggest_float("x", 0.0, 1.0)
    time.sleep(float(os.environ.get("HPO_TEST_SLEEP_S", "60")))
    return 0.0


def gated(trial: Any) -> float:
    """Runs until the file ``HPO_TEST_GATE`` names exists (at most 120 s): a test lets its
    trials end when it has seen what it waits for, not after a guessed sleep."""
    x = trial.suggest_float("x", 0.0, 1.0)
    gate = os.environ["HPO_TEST_GATE"]
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return x


def cuda_probe(trial: Any) -> float:
    """On a real GPU host: what torch and NVML say about the GPU this process runs on."""
    import pynvml
    import torch

    trial.suggest_float("x", 0.0, 1.0)
    trial.set_user_attr("test.torch_device_count", torch.cuda.device_count())
    props = torch.cuda.get_device_properties(0)
    trial.set_user_attr("test.torch_uuid", str(getattr(props, "uuid", "")))
    a = torch.randn(4096, 4096, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(200):
            b = a @ a
    torch.cuda.synchronize()
    trial.set_user_attr("test.autocast_dtype", str(b.dtype))
    pynvml.nvmlInit()
    seen = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        if os.getpid() in pids:
            seen.append(index)
    trial.set_user_attr("test.nvml_gpus_with_my_pid", seen)
    time.sleep(1.0)
    return float(b.float().mean().item())


def oom_when_shared(trial: Any) -> float:
    """Like ``pinned``, but "runs out of GPU memory" (a CUDA-like OOM error) as soon as another
    trial process of this study is pinned to the same fake GPU, checked before every step: a
    GPU with room for one trial."""
    from hpo_orchestrator.gpu import FakeGpuBackend

    spec = os.environ.get("HPO_ORCHESTRATOR_FAKE_GPUS")
    index = slot_info().gpu_index
    x = trial.suggest_float("x", -1.0, 1.0)
    for step in range(1, 4):
        if spec and index is not None and len(FakeGpuBackend.from_spec(spec)._processes(index)[0]) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fake GPU)")
        time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.3")))
        trial.report(x * x + 1.0 / step, step)
    return x * x


def cuda_oom_once(trial: Any) -> float:
    """On a real GPU: the first attempt asks for twice the card's memory (a real CUDA OOM),
    its retry for 1 GiB."""
    import torch

    x = trial.suggest_float("x", 0.0, 1.0)
    total = torch.cuda.get_device_properties(0).total_memory
    size = 2 * total if slot_info().attempt == 1 else 1 << 30
    block = torch.empty(size, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    return x


_calls_in_this_process = 0


def reuse_probe(trial: Any) -> float:
    """Records what a (possibly reused) process looks like to each trial it runs."""
    global _calls_in_this_process
    _calls_in_this_process += 1
    trial.set_user_attr("test.pid", os.getpid())
    trial.set_user_attr("test.calls_in_process", _calls_in_this_process)
    trial.set_user_attr("test.env_trial_number", os.environ.get("HPO_TRIAL_NUMBER"))
    trial.set_user_attr("test.cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES"))
    trial.set_user_attr("test.cuda_device_order", os.environ.get("CUDA_DEVICE_ORDER"))
    trial.set_user_attr("test.phase_stack_empty", phase_depth() == 0)
    trial.set_user_attr("test.attempt", slot_info().attempt)
    x = trial.suggest_float("x", -1.0, 1.0)
    with phase("train"):
        time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.1")))
        trial.report(x * x, 1)
    return x * x


def reports10(trial: Any) -> float:
    """A trivial objective with 10 intermediate reports (scheduling-throughput benchmark)."""
    x = trial.suggest_float("x", 0.0, 1.0)
    for step in range(1, 11):
        trial.report(x / step, step)
    return x


# --- benchmark 4: one fixed GPU workload of LightGBM and torch trials -------------------------

# Every trial of a kind runs with these values, whichever contender runs it, so the contenders
# do the same work; only "kind" is a real parameter (enqueued by scripts/bench_gpu.py).
GPU_MIX_PARAMS = {
    "lightgbm": {"num_leaves": 63, "max_depth": 8, "learning_rate": 0.05, "min_child_samples": 20,
                 "feature_fraction": 0.8, "bagging_fraction": 0.8, "lambda_l1": 1e-3,
                 "lambda_l2": 1e-3},
    "torch": {"batch_size": 1024, "width": 512, "depth": 3, "dropout": 0.1, "lr": 1e-3,
              "weight_decay": 1e-5},
}
_gpu_mix_objectives: dict[str, Any] = {}


class _Preset:
    """A trial whose suggest_* answer from a fixed dict; everything else goes to the trial."""

    def __init__(self, trial: Any, params: dict[str, Any]) -> None:
        self._trial = trial
        self._params = params

    def _fixed(self, name: str, *_args: Any, **_kwargs: Any) -> Any:
        return self._params[name]

    suggest_int = suggest_float = suggest_categorical = _fixed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)


def _gpu_mix_objective(kind: str) -> Any:
    """gpu_mix's objective of this kind, built once per process."""
    from hpo_orchestrator.config import LightGBMObjectiveConfig, TorchMLPObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective
    from hpo_orchestrator.objectives.torch_mlp import TorchMLPObjective

    if kind not in _gpu_mix_objectives:
        scale = float(os.environ.get("HPO_GPU_MIX_SCALE", "1"))  # < 1: a quick run on a CPU
        if kind == "lightgbm":
            _gpu_mix_objectives[kind] = LightGBMObjective(
                LightGBMObjectiveConfig(n_rows=int(400_000 * scale), num_boost_round=200))
        else:
            _gpu_mix_objectives[kind] = TorchMLPObjective(
                TorchMLPObjectiveConfig(n_samples=int(200_000 * scale), epochs=4, batch_size=1024))
    return _gpu_mix_objectives[kind]


def gpu_mix(trial: Any) -> float:
    """LightGBM on the GPU (400k rows, 200 rounds) or an MLP in torch (200k samples, 4
    epochs), as the enqueued ``kind`` says; objects are built once per process."""
    kind = trial.suggest_categorical("kind", ["lightgbm", "torch"])
    return float(_gpu_mix_objective(kind)(_Preset(trial, GPU_MIX_PARAMS[kind])))


def gpu_mix_setup() -> None:
    """gpu_mix's start-up where a user's module would have it (``objective.setup``): torch and
    LightGBM imported, both objectives built, the CUDA context made on the slot's GPU."""
    for kind in GPU_MIX_PARAMS:
        _gpu_mix_objective(kind)
    import torch

    if slot_info().on_gpu and torch.cuda.is_available():
        torch.ones(1, device="cuda").sum().item()


def slurm_probe(trial: Any) -> float:
    """Records the Slurm job and its GPUs first (so a cancelled trial is attributable), then
    reports HPO_TEST_STEPS steps of HPO_TEST_STEP_S seconds."""
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_GPUS"):
        trial.set_user_attr(f"test.{key.lower()}", os.environ.get(key))
    x = trial.suggest_float("x", -1.0, 1.0)
    for step in range(1, int(os.environ.get("HPO_TEST_STEPS", "3")) + 1):
        time.sleep(float(os.environ.get("HPO_TEST_STEP_S", "0.3")))
        trial.report(x * x + 1.0 / step, step)
    return x * x


def pinning_probe(trial: Any) -> float:
    """On a real GPU host (scripts/gpu_pinning_check.py): even trials do torch work and record
    the UUID torch computes on; odd trials train LightGBM on the GPU through OpenCL. The script
    watches NVML's process lists meanwhile, so all three views of "which GPU" can be compared."""
    if trial.number % 2:
        return gpu_mix(_Preset(trial, {"kind": "lightgbm"}))
    import torch

    trial.suggest_float("x", 0.0, 1.0)
    props = torch.cuda.get_device_properties(0)
    trial.set_user_attr("test.torch_uuid", str(getattr(props, "uuid", "")))
    trial.set_user_attr("test.torch_device_count", torch.cuda.device_count())
    a = torch.randn(4096, 4096, device="cuda")
    deadline = time.monotonic() + 3.0  # long enough for the watcher to see the process
    while time.monotonic() < deadline:
        b = a @ a
        torch.cuda.synchronize()
    return float(b.float().mean().item())


def idle_context(trial: Any) -> float:
    """On a real GPU: holds a CUDA context (NVML lists the process) through a `train` phase
    in which it launches no kernel: the seed incident's "GPU used at 0 %"."""
    import torch

    x = trial.suggest_float("x", 0.0, 1.0)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with phase("train"):
        time.sleep(3.0)
    return x


def chatty(trial: Any) -> float:
    """Prints one line to stdout and one to stderr (through the OS, as native code would):
    each must land in this trial's own log, also in a reused worker."""
    print(f"chatty trial {trial.number} stdout", flush=True)
    os.write(2, f"chatty trial {trial.number} stderr\n".encode())
    return float(trial.suggest_float("x", 0.0, 1.0))


def slow_setup() -> None:
    """An ``objective.setup`` that takes a while (data loading, say): start-up above the
    slow_startup finding's floor of 1 s. Its end (local time, as Optuna stores a trial's
    start) goes to the file $HPO_TEST_SETUP_NOTES, if set: a test orders events by it."""
    time.sleep(float(os.environ.get("HPO_TEST_SETUP_S", "1.5")))
    notes = os.environ.get("HPO_TEST_SETUP_NOTES")
    if notes:
        with open(notes, "a") as f:
            f.write(f"{datetime.now().isoformat()}\n")


def hanging_setup() -> None:
    """An ``objective.setup`` that prints, then never ends (a stuck download, say)."""
    print("setup: fetching the data", flush=True)
    time.sleep(3600)


def noted_setup() -> None:
    """An ``objective.setup`` that says where it ran: a line on stdout (the worker's log), one
    in the file $HPO_TEST_SETUP_NOTES, and a phase (which must not reach the pipe of a spare,
    scheduler/_workers.py)."""
    with phase("load"):
        print(f"setup ran in {os.getpid()}", flush=True)
    notes = os.environ.get("HPO_TEST_SETUP_NOTES")
    if notes:
        with open(notes, "a") as f:
            f.write(f"{os.getpid()}\n")


def setup_dies_once() -> None:
    """An ``objective.setup`` whose first run kills its process (a crash in a native import,
    say): the worker dies while it starts up; every later run (a marker file,
    $HPO_TEST_SETUP_NOTES) sets up fine."""
    marker = os.environ["HPO_TEST_SETUP_NOTES"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)


def failing_setup() -> None:
    """An ``objective.setup`` that prints, then fails (a missing data file, say)."""
    print("loading the data", flush=True)
    raise FileNotFoundError("data/train.parquet")


def collections_so_far(trial: Any) -> float:
    """The cycle collector's state when this process imported this module: on or off, how
    many objects were frozen, the collections made so far in each generation."""
    on, frozen, collections = _COLLECTOR_AT_IMPORT
    trial.set_user_attr("test.collector_on", on)
    trial.set_user_attr("test.frozen", frozen)
    trial.set_user_attr("test.collections", collections)
    return trial.suggest_float("x", 0.0, 1.0)


def import_order(trial: Any) -> float:
    """Whether this process loaded LightGBM's library before numpy (worker/__main__.py,
    IMPORT_FIRST). sys.modules keeps the order in which imports finished; lightgbm.libpath
    loads the library and imports nothing heavy."""
    names = list(sys.modules)
    first = "lightgbm.libpath" in names and names.index("lightgbm.libpath") < names.index("numpy")
    trial.set_user_attr("test.lightgbm_before_numpy", first)
    return trial.suggest_float("x", 0.0, 1.0)


def siblings(trial: Any) -> float:
    """``quadratic``, recording how many other worker processes of its orchestrator are alive
    (``test.siblings``): those started for the run, idle or running, not those retired."""
    import psutil

    me = psutil.Process()
    alive = 0
    for other in me.parent().children():
        try:
            if other.pid != me.pid and other.status() != psutil.STATUS_ZOMBIE \
                    and other.cmdline()[:3] == me.cmdline()[:3]:
                alive += 1
        except psutil.NoSuchProcess:
            continue
    trial.set_user_attr("test.siblings", alive)
    return quadratic(trial)
