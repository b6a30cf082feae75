"""Words for what ``pruner.tune=auto`` did (the study attrs hpo.pruner_history and
hpo.pruner_tuning, pruning/_tune_auto.py), shared by the terminal status and the report."""

from __future__ import annotations

from typing import Any

from hpo_orchestrator.status._model import StatusReport

__all__ = ["pruner_tuning_lines"]

_SHOWN_SWITCHES = 5  # the latest switches a terminal shows (--json and the attr keep them all)
_WAIT_FOR = 20  # pruning/_tune_auto.py's MIN_CURVES (status does not import the pruning package)


def _setting(params: dict[str, Any]) -> str:
    return (f"patience={params.get('patience')} min_resource={params.get('min_resource')} "
            f"reduction_factor={params.get('reduction_factor')}")


def _expected(entry: dict[str, Any]) -> str:
    evidence = entry.get("evidence") or {}
    old, new = evidence.get("old") or {}, evidence.get("new") or {}
    if "expected_s_to_best" not in new:
        return ""
    before = f"{old['expected_s_to_best']:.0f} s -> " if "expected_s_to_best" in old else ""
    return (f" (expected device time to the best {before}{new['expected_s_to_best']:.0f} s, "
            f"{evidence.get('replayed_trials', '?')} trials replayed, "
            f"best #{evidence.get('best_trial')} kept)")


def pruner_tuning_lines(report: StatusReport) -> list[str]:
    """A heading line, then the latest switches, each with its evidence; nothing when the
    study ran without pruner.tune=auto and has no switch recorded."""
    history, tuning = report.pruner_history, report.pruner_tuning
    if not (report.pruner_tune or history or tuning):
        return []
    switches = f"{len(history)} switch{'es' if len(history) != 1 else ''}"
    if tuning:
        latest = (f"latest check at {tuning.get('time')} ({tuning.get('replayed_trials')} trials): "
                  f"{tuning.get('decision')}, {tuning.get('reason')}")
    else:
        finished = sum(report.states[s].count for s in ("COMPLETE", "PRUNED") if s in report.states)
        latest = (f"no replay yet: the first comes at {_WAIT_FOR} finished trials with learning "
                  f"curves (the study has {finished} finished)")
    lines = [f"pruner tuning (pruner.tune=auto): {switches}; {latest}"]
    for entry in history[-_SHOWN_SWITCHES:]:
        lines.append(f"  {entry.get('time')} at trial {entry.get('at_trial')}: "
                     f"{_setting(entry['old'])} -> {_setting(entry['new'])}{_expected(entry)}")
    return lines
