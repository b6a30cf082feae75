"""trials_per_gpu=auto's verdicts replayed on the decisions logged in runs D-G on H100s
(docs/BENCHMARKS.md, issue 17): which call each rule of placement/_rules.py makes on the
trial durations those runs measured."""

from __future__ import annotations

import pytest

from hpo_orchestrator.placement._rules import REPROBE_TRIALS, Change, GpuLevel, TrialTime, decide
from tests.placement.test_packer import HOST, LGBM, POLICY, TORCH, _obs, _state, _t

# gpu_mix at two per GPU, steady durations (run D's fixed runs): LightGBM 5 s, torch 8 s.
AT_TWO = {2: {LGBM: (5.0, 5.0), TORCH: (8.0, 8.0)}}


def _at(level: int, gain: float, base: float, kind: str = LGBM) -> TrialTime:
    """A trial at ``level`` whose duration shows ``gain`` over the level below (``base`` s)."""
    return _t(base * level / (level - 1) / gain, kind)


def _at_three(*trials: TrialTime) -> tuple[GpuLevel, Change | None]:
    state = _state(limit=3, times=AT_TWO)
    return decide(POLICY, state, _obs(running=3, trials=trials), HOST, 1.0)


def test_run_f_one_trial_at_074x_does_not_end_a_level() -> None:
    """Run F, gpu0: three per GPU went back to two for good on one LightGBM trial at 0.74x,
    while gpu1 measured the same level at 1.45x. One trial is within its neighbours' noise:
    the level waits for a second."""
    state, change = _at_three(_at(3, 0.74, 5.0))
    assert change is None and state.limit == 3 and state.ceiling == 4
    assert "measuring trial durations at 3 per GPU (1 of 2)" in (state.held or "")
    assert state.gains[3] == pytest.approx(0.74, abs=0.01)


def test_no_gain_needs_two_trials_of_one_kind() -> None:
    """A slow LightGBM trial and a torch trial of no gain: 0.87x from two kinds, one trial
    each, ends nothing (each kind varied 1.5x by what ran beside it). A second LightGBM trial
    that is slow too does."""
    slow, flat = _at(3, 0.74, 5.0), _at(3, 1.02, 8.0, TORCH)
    state, change = _at_three(slow, flat)
    assert change is None and state.limit == 3 and state.gains[3] == pytest.approx(0.87, abs=0.01)
    assert "0.87x the trials/min of 2 per GPU, under the 1.15x" in (state.held or "")
    state, change = _at_three(slow, flat, _at(3, 0.8, 5.0))
    assert change is not None and (change.old, change.new) == (3, 2) and state.ceiling == 2
    assert "no gain" in change.reason


def test_runs_d_and_g_lightgbm_still_backs_off_on_two_trials() -> None:
    """Runs D and G: LightGBM at two per GPU measured 0.94x and 0.88x of one. The first trial
    alone waits; the second of the same kind sends the GPU back to one for good."""
    state = _state(limit=2, times={1: {LGBM: (3.4, 3.5)}})
    first, second = _at(2, 0.94, 3.4), _at(2, 0.88, 3.4)
    state, change = decide(POLICY, state, _obs(running=2, trials=(first,)), HOST, 1.0)
    assert change is None and state.limit == 2
    # two trials: within one standard error (spread not yet measured, 0.2 assumed) of a gain
    state, change = decide(POLICY, state, _obs(running=2, trials=(first, second)), HOST, 2.0)
    assert change is None and state.limit == 2
    four = (first, second, first, second)
    state, change = decide(POLICY, state, _obs(running=2, trials=four), HOST, 3.0)
    assert change is not None and (change.old, change.new) == (2, 1) and state.ceiling == 1
    assert "0.92x the trials/min of 1 per GPU (4 trials" in change.reason
    state, change = decide(POLICY, state, _obs(running=1, trials=()), HOST, 3.0)
    assert change is None and "1 per GPU was the best level" in (state.held or "")


@pytest.mark.parametrize(("gain", "climbs"), [(1.06, False), (1.14, False), (1.2, True),
                                              (1.45, True)])
def test_run_e_a_level_that_barely_gained_is_not_climbed_past(gain: float, climbs: bool) -> None:
    """Run E: three per GPU measured 1.06x of two, auto tried four and sat there, 0.80x of
    fixed three. A level that gained under climb_gain (1.15) is kept (it gained) but is the
    top; run F's gpu1 measured 1.45x and goes on."""
    state, change = _at_three(_at(3, gain, 5.0), _at(3, gain, 8.0, TORCH))
    assert (change is not None and change.new == 4) is climbs
    assert state.ceiling == 4 and state.limit == (4 if climbs else 3)
    if not climbs:
        assert f"{gain:.2f}x the trials/min of 2 per GPU, under the 1.15x" in (state.held or "")


def test_a_barely_gaining_level_climbs_once_its_later_trials_show_the_gain() -> None:
    """The verdict is not final: three per GPU judged 1.06x on its first two trials climbs
    once its later trials bring the measured gain over climb_gain."""
    early = (_at(3, 1.06, 5.0), _at(3, 1.06, 8.0, TORCH))
    state, change = _at_three(*early)
    assert change is None
    later = (*early, _at(3, 1.4, 5.0), _at(3, 1.4, 8.0, TORCH))
    state, change = decide(POLICY, state, _obs(running=3, trials=later), HOST, 2.0)
    assert change is not None and (change.old, change.new) == (3, 4)


def test_run_e2_two_trials_at_096x_do_not_end_a_level() -> None:
    """Run E2: three per GPU went back to two on two trials at 0.96x, where fixed three gained
    1.28x over two in run A. Two trials are within a standard error of a gain: the level is
    kept, and its later trials decide."""
    state, change = _at_three(_at(3, 0.96, 5.0), _at(3, 0.96, 5.0))
    assert change is None and state.limit == 3 and state.ceiling == 4


def test_a_loss_against_a_thin_base_is_measured_again() -> None:
    """Two per GPU left on one clear trial (1.6x over one); three per GPU then loses against
    that one trial. The base may be the noise: back to two without shutting three, and after
    REPROBE_TRIALS trials there (a measured base) three is tried again. Its second visit is
    judged on both visits' trials."""
    state = _state(limit=3, times={1: {LGBM: (10.0, 10.0)}, 2: {LGBM: (12.5,)}},
                   gains={2: 1.6})
    slow = _t(12.5 * 1.5 / 0.6)  # 0.6x of the one trial at two per GPU
    state, change = decide(POLICY, state, _obs(running=3, trials=(slow, slow, slow)), HOST, 1.0)
    assert change is not None and (change.old, change.new) == (3, 2)
    assert "tried again after 8 trials at 2" in change.reason
    assert state.losses.get(3, 0) == 0 and state.past[3][LGBM] == (slow.seconds,) * 3
    at_two = tuple(_t(12.5) for _ in range(REPROBE_TRIALS))
    state, change = decide(POLICY, state, _obs(running=2, util=10.0, trials=at_two[:3]), HOST, 2.0)
    assert change is None and state.ceiling == 2
    state, change = decide(POLICY, state, _obs(running=2, util=10.0, trials=at_two), HOST, 3.0)
    assert change is not None and (change.old, change.new) == (2, 3) and state.ceiling == 3
    # the second visit: two trials at 1.3x; with the first visit's three at 0.6x, 0.82x
    fast = _t(12.5 * 1.5 / 1.3)
    state, change = decide(POLICY, state, _obs(running=3, trials=(fast, fast)), HOST, 4.0)
    assert state.gains[3] == pytest.approx(0.82, abs=0.01)


def test_a_shrinking_gain_stops_the_climb() -> None:
    """Run A: 1.62x at two per GPU, 1.27x at three, then 0.89x at four. At that rate of
    shrinking four would gain 1.0x: three is the top. Run F's gpu1 (1.88x, then 1.45x) goes on."""
    for before, gain, climbs in ((1.62, 1.27, False), (1.88, 1.45, True)):
        state = _state(limit=3, times=AT_TWO, gains={2: before})
        trials = (_at(3, gain, 5.0), _at(3, gain, 8.0, TORCH))
        state, change = decide(POLICY, state, _obs(running=3, util=20.0, trials=trials), HOST, 1.0)
        assert (change is not None and change.new == 4) is climbs
        if not climbs:
            assert "3 per GPU gained 1.27x after 1.62x: at that rate 4 would gain 1.00x" in (
                state.held or "")


def test_the_simulation_script_replays_the_rules(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/sim_packing.py runs the rules end to end, and prints what docs/BENCHMARKS.md
    quotes of it (the "round 3" row: gpu_mix, 100 trials, 10 seeds): the whole line, so a
    change of the rules that moves the numbers fails here until the docs say the new ones."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "sim_packing.py"
    spec = importlib.util.spec_from_file_location("sim_packing", path)
    assert spec is not None and spec.loader is not None
    sim = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sim_packing", sim)  # its dataclasses look themselves up
    spec.loader.exec_module(sim)
    import re

    assert sim.main(["--trials", "100", "--seeds", "10", "--workloads", "gpu_mix"]) == 0
    line = capsys.readouterr().out
    docs = (path.parent.parent / "docs" / "benchmarks" / "gpus.md").read_text()
    quoted = re.search(r"^\| round 3 \| ([0-9.]+x) \(([0-9.]+x)\) \|", docs, re.MULTILINE)
    assert quoted is not None, "docs/benchmarks/gpus.md no longer quotes the round 3 row"
    mean, worst = quoted.groups()
    assert line == ("gpu_mix: fixed 1: 601.9 s, 2: 383.4 s, 3: 304.8 s, 4: 320.0 s; "
                    f"auto {mean} of fixed 3 (worst {worst}); seed 0 levels 1 -> 2 -> 3\n")


def test_a_level_that_gains_nothing_ends_once_its_trials_agree() -> None:
    """Three per GPU at exactly the throughput of two, eight trials each side of a steady
    spread: 1.00x, under 1.05 by more than its standard error (0.04): back to two."""
    base = {2: {LGBM: (5.0, 5.2, 4.8, 5.0, 5.1, 4.9, 5.0, 5.0)}}
    state = _state(limit=3, times=base)
    trials = tuple(_t(s * 1.5) for s in base[2][LGBM])
    state, change = decide(POLICY, state, _obs(running=3, trials=trials), HOST, 1.0)
    assert change is not None and (change.old, change.new) == (3, 2)
    assert "1.00x the trials/min of 2 per GPU" in change.reason
