"""tune-pruner's table and advice for a terminal (pruning/_render.py), from what it promises,
for the mutants mutmut found unguarded (docs/MUTATION.md, "mutmut"): one row per setting, most
of the best trials kept first and then most device time saved, the setting as run always shown
(and marked), the recommendation highlighted, each column's figure, the replay's agreement,
the command to run it and the replay's limits."""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.table import Table
from rich.text import Text

from hpo_orchestrator.pruning import LIMITS, PrunerSetting, ReplayResult, StudyCurves, render_tuning
from hpo_orchestrator.pruning._render import _ordered


def _setting(patience: int) -> PrunerSetting:
    return PrunerSetting("patient_hyperband", patience=patience, min_resource=1, reduction_factor=3)


def _result(patience: int, kept: int, saved: float, current: bool = False, **kw: Any) -> ReplayResult:
    values: dict[str, Any] = dict(
        setting=_setting(patience), current=current, outcomes={}, prune_steps={}, trials=12,
        prune_rate=0.25, median_prune_step=2.5, steps_run=40, gpu_s=120.4, gpu_s_saved=saved,
        startup_share=0.125, top_k=[1, 2, 3], top_k_kept=[1, 2, 3][:kept], best_value=0.123456789,
        agreement=None, unknown=0)
    return ReplayResult(**{**values, **kw})


def test_rows_go_most_best_kept_then_most_saved_and_the_setting_as_run_is_always_shown() -> None:
    a, b, c = _result(0, 3, 10.0), _result(1, 3, 30.0), _result(2, 2, 90.0)
    as_run = _result(3, 1, 0.0, current=True)
    assert _ordered([a, b, c, as_run], None) == [b, a, c, as_run]
    assert _ordered([a, b, c, as_run], 2) == [b, a, as_run]
    assert _ordered([a, b, c, as_run], 4) == [b, a, c, as_run]
    assert _ordered([a, b], 2) == [b, a]


def _cells(table: Table) -> list[list[str]]:
    return [[str(cell) for cell in row] for row in zip(*(c._cells for c in table.columns), strict=True)]


def test_the_table_has_a_row_per_setting_with_its_figures() -> None:
    as_run = _result(3, 2, 0.0, current=True, agreement=0.834, median_prune_step=None,
                     startup_share=None, best_value=None, unknown=2)
    choice = _result(0, 3, 25.6)
    curves = StudyCurves("lgb", "minimize", {}, [], first_number=40)
    group = render_tuning(curves, [as_run, choice], choice, "it saves the most", show=15,
                          command="hpo-orchestrator run pruner.patience=0")
    table, legend, agreement, advice, why, run_with, limits = group.renderables
    assert isinstance(table, Table) and table.title_justify == "left"
    assert table.title == ("pruner replay of study lgb (12 finished trials of the newest from #40 "
                           "on (--last), minimize); 2 settings, best first")
    assert [(str(c.header), c.justify) for c in table.columns] == [
        ("setting", "left"), ("pruned", "right"), ("median step", "right"), ("steps", "right"),
        ("device s", "right"), ("saved s", "right"), ("start-up", "right"), ("top kept", "right"),
        ("best value", "right"), ("?", "right")]
    assert _cells(table) == [
        ["PH p0 m1 r3", "25%", "2.5", "40", "120", "+26", "12%", "3/3", "0.12346", ""],
        ["PH p3 m1 r3 (as run)", "25%", "-", "40", "120", "+0", "-", "2/3", "-", "2"]]
    assert [row.style for row in table.rows] == ["bold green", "cyan"]
    assert isinstance(legend, Text) and legend.plain.startswith("PH pP mM rR: PatientPruner(")
    assert str(legend.style) == "dim"
    assert agreement.plain == ("the replay of the setting the study ran with matches what "
                               "happened for 83% of trials") and str(agreement.style) == "dim"
    assert advice.plain == ("recommendation: patient_hyperband(patience=0, min_resource=1, "
                            "reduction_factor=3)")
    assert why.plain == "  why: it saves the most"
    assert run_with.plain == "  run with: hpo-orchestrator run pruner.patience=0"
    assert limits.plain == LIMITS and str(limits.style) == "dim"


def test_without_a_command_the_pruners_overrides_are_given_and_all_trials_are_named() -> None:
    choice = _result(0, 3, 25.6)
    other = _result(1, 3, 20.0)
    group = render_tuning(StudyCurves("lgb", "minimize", {}, []), [other, choice], choice, "why")
    table, _, _advice, _, run_with, _ = group.renderables
    assert table.title == ("pruner replay of study lgb (12 finished trials, minimize); 2 settings, "
                           "best first")
    assert [row.style for row in table.rows] == ["bold green", None]
    assert run_with.plain == ("  run with: hpo-orchestrator run pruner=patient_hyperband "
                              "pruner.patience=0 pruner.min_resource=1 pruner.reduction_factor=3")
    many = [_result(p, 3, float(p)) for p in range(20)]
    shown = render_tuning(StudyCurves("lgb", "minimize", {}, []), many, many[-1], "why")
    assert len(shown.renderables[0].rows) == 15  # the best 15 of 20 by default
    none = render_tuning(StudyCurves("lgb", "minimize", {}, []), [], choice, "why")
    assert none.renderables[0].title.startswith("pruner replay of study lgb (0 finished trials")


def test_one_setting_alone_is_a_table_of_one_row() -> None:
    """A grid of one setting (the setting as run) still names its trials."""
    as_run = _result(3, 3, 0.0, current=True)
    group = render_tuning(StudyCurves("lgb", "minimize", {}, []), [as_run], as_run, "why")
    assert group.renderables[0].title == ("pruner replay of study lgb (12 finished trials, "
                                          "minimize); 1 settings, best first")


def test_the_legend_spells_out_every_label_and_the_recommendation_stands_out() -> None:
    """The labels are short (``PH p0 m1 r3``): the legend under the table says what each letter
    is; the recommendation is bold and its setting in the chosen row's colour."""
    choice = _result(0, 3, 25.6)
    group = render_tuning(StudyCurves("lgb", "minimize", {}, []), [choice], choice, "why")
    _, legend, advice, *_ = group.renderables
    assert legend.plain == (
        "PH pP mM rR: PatientPruner(patience=P) over HyperbandPruner(min_resource=M, "
        "reduction_factor=R); H mM rR: HyperbandPruner alone; median wW: MedianPruner("
        "n_warmup_steps=W); ?: trials with an unknown end")
    label = choice.setting.label()
    # as the terminal shows them (rich reads style names in any case)
    assert [(span.start, span.end, Style.parse(str(span.style))) for span in advice.spans] == [
        (0, len("recommendation: "), Style(bold=True)),
        (len("recommendation: "), len("recommendation: ") + len(label), Style(bold=True, color="green"))]
