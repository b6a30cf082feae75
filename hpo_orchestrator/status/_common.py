"""What both ways of collecting status share (_collect.py visits every trial, _kept.py reads
the study's tally): running trials, device labels, study attrs, the Pareto front."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hpo_orchestrator import db, keys
from hpo_orchestrator.db import TrialRow

if TYPE_CHECKING:
    from hpo_orchestrator.db import Readable as Connection

__all__ = ["Failures", "device_choices_of", "device_label", "failures_of", "hosts_of",
           "listed_devices", "packing_of", "pareto", "running_of"]


@dataclass(frozen=True)
class Failures:
    """The study's FAIL trials as status counts them."""

    listed: list[tuple[int, str | None, str | None]]  # (number, reason, error) not run again
    rerun: int  # attempts that ran and whose params run again (interrupted, retried)
    reasons: dict[str, int]  # hpo.fail_reason of the FAIL trials that ran
    never_ran: int = 0  # asked ahead and put back before a slot took them


def failures_of(attrs: dict[int, dict[str, Any]]) -> Failures:
    """From each FAIL trial's failure attrs (number -> hpo.fail_reason, hpo.error, hpo.retried,
    hpo.pid). A trial asked ahead that no slot took (retried, and no ``hpo.pid``: the
    orchestrator writes it when a slot takes the trial) never ran: it is neither a re-run
    attempt nor an interrupted trial, so that the summary agrees with the run's progress,
    which never saw it. Only FAIL trials are read: a reason another client wrote on a COMPLETE
    or PRUNED trial is no failure."""
    listed, rerun, never_ran, reasons = [], 0, 0, Counter[str]()
    for number, found in attrs.items():
        retried = found.get(keys.RETRIED) is True
        if retried and keys.PID not in found:
            never_ran += 1
            continue
        rerun += retried
        if found.get(keys.FAIL_REASON):
            reasons[str(found[keys.FAIL_REASON])] += 1
        if not retried:
            listed.append((number, found.get(keys.FAIL_REASON), found.get(keys.ERROR)))
    return Failures(sorted(listed), rerun, dict(sorted(reasons.items())), never_ran)


def pareto(connection: Connection, study_id: int, directions: list[str]) -> list[dict[str, Any]]:
    """A multi-objective study's Pareto-optimal trials with their params (none for one objective:
    ``best`` says it)."""
    if len(directions) < 2:
        return []
    return [{"number": t.number, "values": list(t.values),
             "params": db.trial_params(connection, t.trial_id)}
            for t in db.best_trials(connection, study_id)[1]]


def running_of(connection: Connection, trials: list[db.UncoveredTrial], db_now: datetime | None,
               now: float, config: dict[str, Any], hosts: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The running ones among ``trials``, with their last step and heartbeat age (database
    clock vs database clock), and the numbers of those only queued.

    A trial asked ahead of a free slot (scheduler.prefetch) is RUNNING to Optuna but has no
    process yet: the orchestrator records its slot (hpo.slot) when a slot takes it. Its
    heartbeat is kept up meanwhile; a stale one stays with the running (stale_running).
    A trial no orchestrator asked (``optuna ask``: db.asked_outside) is running on device
    ``outside``, ``"outside": true``: its maker finishes it, no run reaps it.
    """
    storage = config.get("storage", {})
    grace = storage.get("grace_period_s") or 3 * (storage.get("heartbeat_interval_s") or 10)
    running: list[dict[str, Any]] = []
    outside: set[int] = set()  # made by `optuna ask` or another program: no run's to finish
    for trial_id, row, attrs in sorted((u for u in trials if u.row.state == "RUNNING"),
                                       key=lambda u: u.row.number):
        beat = db.heartbeat_of(connection, trial_id)
        age = (db_now - beat).total_seconds() if beat is not None and db_now is not None else None
        if db.asked_outside(attrs, beat is not None):
            outside.add(row.number)
        running.append({
            "number": row.number, "host": row.host,
            "device": "outside" if row.number in outside
            else device_label(row.host, row.gpu_index, hosts),
            "elapsed_s": now - row.start_s if row.start_s is not None else None,
            "last_step": row.last_step, "heartbeat_age_s": age,
            "stale": age is not None and age > grace, "grace_s": grace,
            "outside": row.number in outside,
            # a first-wave worker's start-up outlasted the run's wait (hpo.setup_running)
            "setup_running": attrs.get(keys.SETUP_RUNNING) is True})
    slotless = {u.row.number for u in trials if u.row.state == "RUNNING" and config
                and u.attrs.get(keys.SLOT) is None and u.row.number not in outside}
    queued = sorted(r["number"] for r in running if r["number"] in slotless and not r["stale"])
    return [r for r in running if r["number"] not in queued], queued


def device_label(host: str | None, gpu: int | None, hosts: int) -> str:
    """gpu0 / cpu, prefixed with the host when the study ran on several."""
    device = "cpu" if gpu is None else f"gpu{gpu}"
    return f"{host}:{device}" if hosts > 1 and host else device


def device_choices_of(study_attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """hpo.device_choice.<host> of every host (objective.device=auto's latest measurement),
    with the host named; an entry someone else wrote in another shape is left out."""
    return [{"host": key.removeprefix(keys.DEVICE_CHOICE_PREFIX), **value}
            for key, value in sorted(study_attrs.items())
            if key.startswith(keys.DEVICE_CHOICE_PREFIX) and isinstance(value, dict)]


def packing_of(study_attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """hpo.packing.<host> of every host, with the host named (scheduler/_packer.py writes it)."""
    return [{"host": key.removeprefix(keys.PACKING_PREFIX), **value}
            for key, value in sorted(study_attrs.items())
            if key.startswith(keys.PACKING_PREFIX) and isinstance(value, dict)]


def listed_devices(study_attrs: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """host -> its GPUs, as each orchestrator recorded them (study attr hpo.devices.<host>), so
    a GPU that never got a trial still shows up."""
    return {key.removeprefix(keys.DEVICES_PREFIX): devices or [] for key, devices in study_attrs.items()
            if key.startswith(keys.DEVICES_PREFIX)}


def hosts_of(rows: list[TrialRow], listed: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {r.host for r in rows if r.host} | set(listed)
