"""The loop as a recipe (issue 29, item 7; scheduler/_recipe.py): the duties run in their
list's order, each timed; the one that ends the loop ends the round there; a slow one is
logged at DEBUG (shown with --debug). A fake clock: nothing sleeps."""

from __future__ import annotations

import logging

import pytest

from hpo_orchestrator.scheduler._recipe import Duty, Recipe


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_duties_run_in_order_and_the_ending_one_ends_the_round(caplog: pytest.LogCaptureFixture) -> None:
    clock, ran, done = _Clock(), [], [False]

    def duty(name: str, seconds: float = 0.0) -> Duty:
        def run() -> None:
            ran.append(name)
            clock.now += seconds
        return Duty(name, run)

    recipe = Recipe([duty("launch"), duty("pack", 0.3), Duty("done", lambda: done[0], ends_loop=True),
                     duty("calls", 0.01)], clock=clock)
    with caplog.at_level(logging.DEBUG, logger="hpo_orchestrator"):
        assert recipe.round() is False
        done[0] = True
        assert recipe.round() is True
    assert ran == ["launch", "pack", "calls", "launch", "pack"]
    assert recipe.spent["pack"] == pytest.approx(0.6) and recipe.spent["calls"] == pytest.approx(0.01)
    assert [r.getMessage() for r in caplog.records] == ["loop: pack took 0.300 s"] * 2


def test_each_duty_has_its_own_name() -> None:
    with pytest.raises(ValueError):
        Recipe([Duty("a", lambda: None), Duty("a", lambda: None)])
