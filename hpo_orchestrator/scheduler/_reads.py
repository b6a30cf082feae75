"""A child's reads of its trial and study (worker/_protocol.READ_CALLS), answered from the
orchestrator's ``optuna.Trial``.

These are asked for when the objective reads them rather than sent with every Job: the
study's attrs may change while the trial runs (another host, ``enqueue``), and
``relative_params`` costs a sampler call that most objectives never make. The answers are
plain values (dicts of JSON values, parameter values), as every reply.
"""

from __future__ import annotations

from typing import Any

import optuna

__all__ = ["answer_read"]


def answer_read(trial: optuna.Trial, what: str) -> dict[str, Any]:
    if what == "relative_params":
        return dict(trial.relative_params)
    if what == "study.user_attrs":
        return dict(trial.study.user_attrs)
    if what == "study.system_attrs":
        return dict(trial.storage.get_study_system_attrs(trial.study._study_id))
    raise ValueError(f"no such read: {what!r}")
