"""One compact record per trial of a benchmark run, kept in results.json beside its curve.

The curve says when each complete trial ended and with what value; it does not say why a run
was slow. On workload (b) ours' runs finished 37-55 trials (medians of three sets of 5 seeds)
where the CUDA processes finished 66-84, and the runs' logs kept only each run's latest
``objective.device=auto`` measurement
(docs/quality/runs.md, workload b): whether the measurements or the trials themselves were slow
could not be told from what came back. The GPU host's runs are ``--slim`` (their sqlite files
stay there), so these records are what comes back: each trial's start and end (seconds since
the launch), state, params, the LightGBM learner and threads it trained with, and, where a
trial of ours measured ``objective.device=auto``, the timings behind the choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpo_orchestrator import keys

__all__ = ["trial_records"]

_SIGNIFICANT = 4  # digits kept of a float: enough to tell trials apart, a third of the bytes


def _short(value: Any) -> Any:
    return float(f"{value:.{_SIGNIFICANT}g}") if isinstance(value, float) else value


def _seconds(moment: Any, launch: float) -> float | None:
    return None if moment is None else round(moment.timestamp() - launch, 2)


def _choice(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The measurement a trial made (``hpo.device_choice`` with ``measured_here``); a trial
    that reused its worker's earlier answer made none."""
    choice = attrs.get(keys.DEVICE_CHOICE)
    if not isinstance(choice, dict) or not choice.get("measured_here"):
        return None
    listed = choice.get("timings")
    timings = [{k: _short(v) for k, v in t.items() if v is not None}
               for t in (listed if isinstance(listed, list) else []) if isinstance(t, dict)]
    return {"learner": choice.get("learner"), "timings": timings}


def trial_records(trials: Iterable[Any], launch: float, budget: float) -> list[dict[str, Any]]:
    """Every trial started within the budget, in order of start: ``n`` (its number), ``state``
    (lower case; as read after the stop: a trial of ours the stop interrupted shows as failed,
    one of Optuna's processes as running, and Ray records none),
    ``start`` and ``end`` (seconds since ``launch``; ``end`` None while unfinished), ``params``,
    and where known ``learner`` and ``threads`` (LightGBM's device_type and num_threads as
    the model recorded them), ``gpu`` (ours: the GPU's index) and ``choice``
    (:func:`_choice`)."""
    records = []
    for trial in trials:
        start = _seconds(trial.datetime_start, launch)
        if start is None or start > budget:
            continue
        attrs = trial.user_attrs
        record: dict[str, Any] = {"n": trial.number, "state": trial.state.name.lower(),
                                  "start": start, "end": _seconds(trial.datetime_complete, launch),
                                  "params": {k: _short(v) for k, v in trial.params.items()}}
        effective = attrs.get(keys.PARAMS_EFFECTIVE)
        if isinstance(effective, dict):
            record["learner"] = effective.get("device_type")
            record["threads"] = effective.get("num_threads")
        if attrs.get(keys.GPU_INDEX) is not None:
            record["gpu"] = attrs[keys.GPU_INDEX]
        choice = _choice(attrs)
        if choice is not None:
            record["choice"] = choice
        records.append(record)
    return sorted(records, key=lambda r: (r["start"], r["n"]))
