"""Findings: what went wrong with the GPU time of a study, each backed by numbers.

Every rule here comes from a real incident (docs/DESIGN.md §1, §5). A finding says what was seen
(``message``), the numbers behind it (``evidence``), and what to change (``advice``), naming
the configuration keys to turn. Thresholds are module constants, so they are easy to find and
to argue about.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

from hpo_orchestrator.status._model import DeviceUse, Finding, StatusReport, StudyFacts
from hpo_orchestrator.status._packing_lines import cpu_share, packing_hold, packing_of_device

__all__ = ["find_all"]

# A GPU busy less than this share of its host's time with trials running, and of that time
# while trials still waited to start, is idle
IDLE_BUSY_BELOW = 0.75
# A GPU empty for less than this in all, while trials waited to start, is not worth a finding
# (two trials started a few ms apart leave a window of those ms)
IDLE_MIN_EMPTY_S = 5.0
# Idle seconds per trial on a GPU below this are the orchestrator's own latency between one
# trial's end and the next one's start (tiny trials), not work the GPU could have had
IDLE_GAP_FLOOR_S = 1.0
LOW_UTIL_BELOW = 50.0  # % SM utilization in the compute phase that counts as underfed
STARTUP_SHARE_ABOVE = 0.25  # startup above this share of the time to the first pruning decision
STARTUP_FLOOR_S = 1.0  # a start-up shorter than this is not worth a finding, whatever its share
FAILING_SHOWN = 3  # most common errors named by failing_trials
# A number in an error message (a value, an address, a line): masked to group the messages of
# one cause, as scheduler/_failures.FailurePolicy._key does for study.fail_fast.
_NUMBER = re.compile(r"\d+(\.\d+)?")
AGGRESSIVE_PRUNE_RATE = 0.6  # prune rate at or above which early pruning is looked at
EARLY_STEP_SHARE = 0.25  # "early": pruned at or before this share of the steps a full trial runs
# The default pruner's patience and min_resource (conf/pruner/patient_hyperband.yaml; status
# does not load the config package): under reach, from these up early prunes are its verdicts
DEFAULT_PATIENCE = 3
DEFAULT_MIN_RESOURCE = 3
MIN_TRIALS = 3  # fewer trials than this prove nothing about rates and medians


def find_all(report: StatusReport, facts: StudyFacts) -> list[Finding]:
    findings: list[Finding] = []
    findings += _failing_trials(facts)
    findings += _idle_gpus(report, facts)
    findings += _low_utilization(report, facts.config)
    findings += _gpu_unused(facts)
    findings += _slow_startup(facts)
    findings += _aggressive_pruning(report, facts)
    findings += _params_differ(facts)
    findings += _stale_running(report)
    findings += _oom(report, facts.config)
    findings += _shared_cores(facts)
    return findings


def _trials(count: int) -> str:
    """"1 trial", "3 trials": the count a finding's message opens with."""
    return f"{count} trial{'' if count == 1 else 's'}"


def _few(numbers: list[int], limit: int = 8) -> str:
    shown = ", ".join(f"#{n}" for n in numbers[:limit])
    return shown + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")


def _idle_gpus(report: StatusReport, facts: StudyFacts) -> list[Finding]:
    """GPUs without a trial for much of the time the study's runs had trials running and others
    waiting to start. The figures are the per-device table's (busy over that time); another
    study's trials on the same GPU count as busy, as the host saw it. One finding names every
    idle GPU (the advice is the same for all): one per GPU read as eight problems on an 8-GPU
    host."""
    gpus = [d for d in report.per_device if d.gpu_index is not None]
    # each with the share other studies' trials kept it busy
    idle = [(use, others) for use in gpus if (others := _idle_share(use, facts)) is not None]
    if not idle:
        return []
    parallel = facts.config.get("scheduler", {}).get("parallel")
    short = [len([g for g in gpus if g.host == use.host]) for use, _ in idle]  # parallel is per host
    return [Finding("idle_gpu", "warning", _idle_message(idle), _idle_advice(parallel, max(short)), {
        "device": ", ".join(u.device for u, _ in idle),
        "devices": [{"device": u.device, "busy_fraction": round(u.busy_fraction or 0, 3),
                     "busy_fraction_queued": round(u.busy_fraction_queued or 0, 3),
                     "active_s": round(u.active_s or 0, 1),
                     **({"other_studies_fraction": round(o, 3)} if o > 0 else {}),
                     "trials": u.trials} for u, o in idle],
        "scheduler.parallel": parallel})]


def _idle_share(use: DeviceUse, facts: StudyFacts) -> float | None:
    """The share of the wait other studies' trials kept an idle GPU busy; None where the GPU
    was not idle: busy enough overall or while trials waited, or empty for too short a time
    in all or per trial (the orchestrator's latency between tiny trials)."""
    busy, queued, waited = use.busy_fraction, use.busy_fraction_queued, use.active_queued_s
    if busy is None or queued is None or not waited \
            or busy >= IDLE_BUSY_BELOW or queued >= IDLE_BUSY_BELOW:
        return None
    others = min(1.0, facts.other_studies_s.get((use.host, use.gpu_index), 0.0) / waited)
    empty_s = (1.0 - queued - others) * waited
    if queued + others >= IDLE_BUSY_BELOW or empty_s < IDLE_MIN_EMPTY_S \
            or empty_s / (use.trials + 1) < IDLE_GAP_FLOOR_S:
        return None
    return others


def _idle_advice(parallel: Any, gpus_on_host: int) -> str:
    """parallel may be null or "auto" (every GPU): only a fixed number can be too few."""
    if isinstance(parallel, int) and not isinstance(parallel, bool) and parallel < gpus_on_host:
        return (f"scheduler.parallel={parallel} runs fewer trials than this host has GPUs "
                f"({gpus_on_host}): set scheduler.parallel={gpus_on_host} or more")
    return ("slots stayed empty between trials: look at startup time (hpo.startup_s), "
            "trials failing at once, or another process holding the GPU")


def _idle_message(idle: list[tuple[DeviceUse, float]]) -> str:
    def while_waiting(use: DeviceUse, others: float, trials: str) -> str:
        shared = f", other studies' trials {others:.0%}" if others > 0 else ""
        return f"{use.busy_fraction_queued:.0%} while trials waited to start{shared}; {trials}"

    if len(idle) == 1:
        use, others = idle[0]
        return (f"{use.device} was busy {use.busy_fraction:.0%} of the {use.active_s or 0:.0f} s "
                f"with trials running ({while_waiting(use, others, f'{_trials(use.trials)} ran on it')})")
    each = ", ".join(f"{u.device} {u.busy_fraction:.0%} ({while_waiting(u, o, _trials(u.trials))})"
                     for u, o in idle)
    return (f"{len(idle)} GPUs were busy under {IDLE_BUSY_BELOW:.0%} of the time with "
            f"trials running: {each}")


_LOW_UTIL_ADVICE = {
    "lightgbm": "LightGBM's GPU learners (CUDA, OpenCL) keep a GPU busy only on large data: let the "
                "orchestrator run more trials per GPU (leave scheduler.parallel and "
                "trials_per_gpu unset), raise objective.n_rows, or train on CPU "
                "(objective.device=cpu) and use the GPUs for other studies",
    "default": "the GPU waits for input: raise the batch size, DataLoader num_workers and "
               "prefetch_factor, use pin_memory=True, keep the data on the GPU, or let the "
               "orchestrator run more trials per GPU (leave scheduler.parallel and "
               "trials_per_gpu unset)",
}


_AUTO_ADVICE = ("more trials per GPU did not fill it (see packing): feed each trial faster (batch "
                "size, DataLoader workers, data on the GPU), or run another study on these GPUs")

# What to do about a GPU that trials_per_gpu=auto held under-used, by what held it (the level's
# held_by, placement/_rules.py HOLD_CAUSES). "Feed each trial faster" is the advice only where
# more trials were tried and did not pay (or nothing is known): on a host short of cores or a
# GPU short of memory it sent users after the wrong thing (issue 51).
_HOLD_ADVICE = {
    "cpu": "the host's cores held it, not the GPU (see packing): give the run more cores "
           "(scheduler.host_cores, the CPU affinity or the Slurm allocation), or fewer threads "
           "to each trial (scheduler.threads_per_trial)",
    "memory": "GPU memory held it: one more trial would not fit beside the running ones (see "
              "packing): make each trial smaller on the GPU (batch size, model, mixed "
              "precision), or run another study on these GPUs",
    "parallel": "scheduler.parallel capped the trials on this host: leave it unset (or raise it) "
                "so that more trials share each GPU",
    "max_trials_per_gpu": "scheduler.max_trials_per_gpu capped it: raise it, more trials at "
                          "once may still fill the GPU",
    "measuring": "the run ended while more trials per GPU were still being measured (see "
                 "packing): a longer run, or the next run of this study, packs it further",
}


def _auto_advice(cause: str | None) -> str:
    """The advice for a GPU trials_per_gpu=auto left under-used, by what held it."""
    return _HOLD_ADVICE.get(cause or "", _AUTO_ADVICE)


def _low_utilization(report: StatusReport, config: dict[str, Any]) -> list[Finding]:
    objective = config.get("objective", {}).get("name")
    advice = _LOW_UTIL_ADVICE.get(objective, _LOW_UTIL_ADVICE["default"])
    found = []
    for use in report.per_device:
        util = use.util_compute_mean
        if use.gpu_index is None or util is None or util >= LOW_UTIL_BELOW:
            continue
        packed = packing_of_device(report.packing, use.host, use.gpu_index)
        chose = next((c for c in report.device_choices if c["host"] == use.host), None)
        # auto sent most of this GPU's trials to the CPU: the GPU was not needed, not starved
        on_cpu = (cpu_share(chose, use.gpu_index) or 0.0) >= 0.5
        how: str | None
        if chose is not None and on_cpu:
            how = (f"objective.device=auto measured the CPU faster and trained most of its "
                   f"trials there ({chose.get('reason', '-')}): the GPU was not needed for "
                   f"these trials")
            tip = ("nothing to fix for this study; run another study on the GPU, or give it "
                   "scheduler.gpus=none to leave it free")
        else:
            how = packed
            tip = advice if packed is None else _auto_advice(
                packing_hold(report.packing, use.host, use.gpu_index))
        found.append(Finding(
            "low_gpu_util", "info" if chose is not None and on_cpu else "warning",
            f"{use.device} averaged {util:.0f}% utilization while training "
            f"({'-' if use.util_mean is None else f'{use.util_mean:.0f}%'} overall)"
            + (f"; {how}" if how else ""),
            tip,
            {"device": use.device, "util_compute_mean": util, "util_mean": use.util_mean,
             "threshold": LOW_UTIL_BELOW, "packing": packed}))
    return found


def _gpu_unused(facts: StudyFacts) -> list[Finding]:
    if not facts.unverified:
        return []
    numbers = [number for number, _ in facts.unverified]
    platforms = sorted({platform for _, platform in facts.unverified if platform})
    where = f" (LightGBM OpenCL platform: {', '.join(platforms)})" if platforms else ""
    return [Finding(
        "gpu_unused", "warning",
        f"{_trials(len(numbers))} asked for a GPU that showed no work from them while they "
        f"trained{where}: {_few(numbers)}",
        "the work ran on the CPU: for LightGBM keep objective.gpu_platform=auto (it picks the "
        "NVIDIA OpenCL platform); for torch move the model and every batch to 'cuda'",
        {"trials": numbers, "opencl_platforms": platforms})]


def _slow_startup(facts: StudyFacts) -> list[Finding]:
    if facts.startup is None:
        return []
    n_pairs, startup, decision = facts.startup
    if n_pairs < MIN_TRIALS:
        return []
    if decision <= 0 or startup < STARTUP_FLOOR_S or startup / decision < STARTUP_SHARE_ABOVE:
        return []
    return [Finding(
        "slow_startup", "warning",
        f"starting a trial takes {startup:.1f} s, {startup / decision:.0%} of the "
        f"{decision:.1f} s until its first pruning decision (medians of {n_pairs} trials)",
        _startup_advice(facts.config),
        {"startup_s_median": round(startup, 3), "first_decision_s_median": round(decision, 3),
         "share": round(startup / decision, 3), "trials": n_pairs})]


def _startup_advice(config: dict[str, Any]) -> str:
    """Only the changes that are not made already."""
    min_resource = config.get("pruner", {}).get("min_resource")
    mode = config.get("scheduler", {}).get("worker_mode")
    objective = config.get("objective", {})
    steps = []
    if min_resource == "auto":
        steps.append("lower pruner.startup_share (min_resource=auto then waits longer before "
                     "the first pruning decision)")
    elif min_resource is not None and config.get("pruner", {}).get("name") == "hyperband":
        steps.append(f"raise pruner.min_resource (now {min_resource})")  # no auto for it
    elif min_resource is not None:
        steps.append(f"raise pruner.min_resource (now {min_resource}) or set pruner.min_resource=auto")
    if mode is not None and mode != "reuse":
        steps.append(f"set scheduler.worker_mode=reuse (now {mode}): imports and set-up once per slot")
    if objective.get("name") == "custom" and not objective.get("setup"):
        steps.append("load the data once per worker in objective.setup")
    if not steps:
        steps.append("make the objective's own start faster (data loading, model building)")
    return "each start buys little training before the pruner decides: " + "; ".join(steps)


def _failing_trials(facts: StudyFacts) -> list[Finding]:
    """Trials that failed by their own doing (not interrupted, not retried), by error message
    with its numbers masked, as the failure policy groups them (scheduler/_failures.py):
    ``diverged at x=4.41`` and ``x=0.78`` are one cause, not two. A cause whose messages
    differ is shown masked (``x=#``) with one message quoted whole, so none is misquoted."""
    failed = [(n, reason, error) for n, reason, error in facts.failures if reason != "interrupted"]
    if not failed:
        return []
    by_error: Counter[str] = Counter()
    example: dict[str, tuple[int, str]] = {}
    texts: dict[str, set[str]] = {}
    for number, reason, error in failed:
        text = error or reason or "unknown"
        key = _NUMBER.sub("#", text)
        by_error[key] += 1
        example.setdefault(key, (number, text))
        if len(texts.setdefault(key, set())) < 2:
            texts[key].add(text)
    common = by_error.most_common(FAILING_SHOWN)

    def cause(key: str) -> str:
        number, text = example[key]
        if len(texts[key]) == 1:
            return f"{text} (e.g. trial {number})"
        return f"{key} (the numbers vary; e.g. trial {number}: {text})"
    shown = "; ".join(f"{n} x {cause(k)}" for k, n in common)
    if len(by_error) > len(common):
        rest = len(failed) - sum(n for _, n in common)
        shown += f"; {rest} more with {len(by_error) - len(common)} other message(s)"
    first = example[common[0][0]][0]
    return [Finding(
        "failing_trials", "warning",
        f"{_trials(len(failed))} failed: {shown}",
        f"'hpo-orchestrator logs {first}' shows that trial's output and traceback "
        f"('hpo-orchestrator status --trial {first}' its params)",
        {"failed": len(failed), "errors": [{"error": example[k][1], "pattern": k, "count": n,
                                            "example_trial": example[k][0]} for k, n in common]})]


def _aggressive_pruning(report: StatusReport, facts: StudyFacts) -> list[Finding]:
    pruned = sum(report.prune_steps.values())
    finished = sum(report.states[s].count for s in ("COMPLETE", "PRUNED", "FAIL") if s in report.states)
    if report.prune_rate is None or finished < MIN_TRIALS or report.prune_rate < AGGRESSIVE_PRUNE_RATE \
            or not pruned:
        return []
    steps = sorted(step for step, n in report.prune_steps.items() for _ in range(n))
    median_step = statistics.median(steps)
    full = facts.max_complete_step if facts.max_complete_step is not None else max(steps)
    early = sum(1 for s in steps if s <= max(1, EARLY_STEP_SHARE * full))
    if median_step > EARLY_STEP_SHARE * full:
        return []
    pruner = facts.config.get("pruner", {})
    if _reach_at_its_patience(pruner):
        # Early prunes under reach are then mostly its own verdicts (on best-so-far reports,
        # all of them: patience never lets Hyperband act there), each on the study's evidence
        # that the trial could not reach the best value: no sign of a pruner too eager, as on
        # the README's example; the risk left is curves that gain more late than any complete
        # one. Below that patience or min_resource Hyperband's own early verdicts (the
        # incident of docs/DESIGN.md §1) are as likely: the warning stays.
        severity, why = "info", (
            "most were stopped as out of reach of the best value: even gaining what the "
            "complete trial that gained most from their step gained, they would end worse "
            "(docs/DESIGN.md §3.13); where trials can gain more late than the complete ones "
            "did (a small learning rate), 'pruner.patience_mode=veto' lets them run")
    else:
        severity, why = "warning", ("most trials are stopped before they show their level, and "
                                    f"GPU time goes to starting trials: {_gentler(pruner)}")
    return [Finding(
        "aggressive_pruning", severity,
        f"{report.prune_rate:.0%} of finished trials were pruned, half of them by step "
        f"{median_step:g} of {full} ({early} of {pruned} in the first {EARLY_STEP_SHARE:.0%})",
        f"{why}; 'hpo-orchestrator tune-pruner' replays this study's curves to find a setting",
        {"prune_rate": round(report.prune_rate, 3), "median_prune_step": median_step,
         "max_step": full, "pruned_early": early, "pruned": pruned})]


def _reach_at_its_patience(pruner: dict[str, Any]) -> bool:
    """patience_mode=reach with patience and min_resource at least the default's (or
    min_resource measured from the trials' start-up: auto)."""
    def at_least(value: Any, floor: int) -> bool:
        return isinstance(value, int) and value >= floor

    return (pruner.get("name") == "patient_hyperband" and pruner.get("patience_mode") == "reach"
            and at_least(pruner.get("patience"), DEFAULT_PATIENCE)
            and (pruner.get("min_resource") == "auto"
                 or at_least(pruner.get("min_resource"), DEFAULT_MIN_RESOURCE)))


def _gentler(pruner: dict[str, Any]) -> str:
    """The keys that make the study's own pruner wait longer (each pruner has its own)."""
    def now(*keys: str) -> str:
        values = ", ".join(f"{k}={pruner[k]}" for k in keys if k in pruner)
        return f" (now {values})" if values else ""

    if pruner.get("name") == "median":
        return f"raise pruner.n_warmup_steps{now('n_warmup_steps')}"
    if pruner.get("name") == "none":
        return ("pruner=none: the objective stops these trials itself (it raises "
                "optuna.TrialPruned); let it wait longer, or give the study a pruner")
    if pruner.get("name") == "hyperband":
        return (f"raise pruner.min_resource{now('min_resource')}, or use pruner=patient_hyperband "
                "(Hyperband's verdict waits for pruner.patience steps without improvement; only "
                "trials out of reach of the best value are stopped sooner)")
    return f"raise pruner.patience and pruner.min_resource{now('patience', 'min_resource')}"


def _params_differ(facts: StudyFacts) -> list[Finding]:
    if not facts.mismatches:
        return []
    number, example = facts.mismatches[0]
    name, (wanted, got) = next(iter(example.items()))
    names = sorted({n for _, mismatch in facts.mismatches for n in mismatch})
    return [Finding(
        "params_differ", "warning",
        f"{_trials(len(facts.mismatches))} ran with parameters other than suggested "
        f"({', '.join(names)}); e.g. trial #{number}: {name} suggested {wanted!r}, ran with {got!r}",
        "the objective does not pass these to the library, or the library overrides them: "
        "compare hpo.params_effective with the trial's params",
        {"trials": [n for n, _ in facts.mismatches], "params": names})]


def _stale_running(report: StatusReport) -> list[Finding]:
    stale = [r for r in report.running if r.get("stale")]
    if not stale:
        return []
    oldest = max(r["heartbeat_age_s"] for r in stale)
    return [Finding(
        "stale_running", "warning",
        f"{_trials(len(stale))} {'is' if len(stale) == 1 else 'are'} RUNNING without a "
        f"heartbeat for up to {oldest:.0f} s "
        f"(grace {stale[0]['grace_s']} s): {_few([r['number'] for r in stale])}",
        "their orchestrator is gone: any running orchestrator on this study fails them as "
        "'lost'; or run the same command again to resume",
        {"trials": [r["number"] for r in stale], "oldest_heartbeat_age_s": round(oldest, 1)})]


def _oom(report: StatusReport, config: dict[str, Any]) -> list[Finding]:
    count = report.fail_reasons.get("oom", 0)
    if not count:
        return []
    per_gpu = config.get("scheduler", {}).get("trials_per_gpu")
    return [Finding(
        "oom", "warning", f"{_trials(count)} ran out of memory",
        "lower the batch size or the model size range, or run fewer trials per GPU "
        f"(scheduler.trials_per_gpu{f', now {per_gpu}' if per_gpu else ''})",
        {"trials": count})]


def _shared_cores(facts: StudyFacts) -> list[Finding]:
    """Other runs of a host kept busy cores the study's trials ran on (placement/_cores.py):
    those trials ran slower, and their durations are not the study's usual ones."""
    if not facts.shared_cores:
        return []
    each = []
    for shared in facts.shared_cores:
        others = shared["others"]
        if len(others) == 1:
            runs = f"another hpo-orchestrator run ({_core_user(others[0])})"
        else:
            runs = (f"{len(others)} other hpo-orchestrator runs ("
                    + "; ".join(f"{_core_user(o)}: {o['cores']}" for o in others) + ")")
        until = f"to {shared['until']}" if shared.get("until") else "on (its end not recorded)"
        cores = f"{shared['cores']} core{'s' if shared['cores'] != 1 else ''}"
        each.append(f"host {shared['host']}, from {shared['since']} {until}: {runs} used "
                    f"{sum(o['cores'] for o in others)} of the {cores} the study's trials ran "
                    f"on, beside the {shared['wanted']} they used")
    split = min(s["cores"] // (len(s["others"]) + 1) for s in facts.shared_cores)
    own = f"scheduler.host_cores={split} in each, or taskset -c" if split >= 1 else "taskset -c"
    return [Finding(
        "shared_cores", "warning", "; ".join(each) + ": trials shared cores and ran slower",
        f"give each run its own cores ({own}), or run the studies one after the other",
        {"hosts": facts.shared_cores})]


def _core_user(other: dict[str, Any]) -> str:
    return f"pid {other['pid']}, {other.get('user') or 'an unknown user'}, study {other['study']!r}"
