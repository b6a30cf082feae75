"""Issue 16's dead ends, one test (at least) each: what a new user meets in the first hour.

The numbers in the test names are the issue's: 1 the commands `make hpo` suggests, 2 the
current folder importable, 3 failing objectives, 4 the last step never pruned, 5 a finished
study rerun, 6 another objective in the same study, 7 queued trials and slow_startup, 8 the
latest study by default, 9 progress, 10 the small ones, 11 the CPU torch.
"""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from hpo_orchestrator.cli import _first_hour as _cli_trials
from hpo_orchestrator.cli import main
from hpo_orchestrator.scheduler._failures import FailurePolicy
from hpo_orchestrator.scheduler._logs import cap_log, read_tail, run_dir, user_frames
from hpo_orchestrator.status._findings import find_all
from hpo_orchestrator.status._model import StatusReport, StudyFacts
from hpo_orchestrator.study import objective_differences
from tests.conftest import REPO, run_cli, trial_rows

TARGET = "objective.target=tests.objectives:"
NAME_ERROR = "NameError: name 'optuna' is not defined"


# --- 1: the next commands work as typed -----------------------------------------------------


def test_1_make_has_the_targets_a_run_suggests() -> None:
    dry = subprocess.run(["make", "-n", "status", "report", "logs", "TRIAL=3", "VENV=.venv"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/hpo-orchestrator status" in dry
    assert ".venv/bin/hpo-orchestrator report --out report.html" in dry
    assert ".venv/bin/hpo-orchestrator logs 3" in dry


@pytest.mark.parametrize(("under_make", "storage", "expected"), [
    (True, "sqlite:///hpo.db", "next: make status  |  make report  |  make logs TRIAL=7"),
    ("make -f /src/hpo/Makefile", "sqlite:///hpo.db",
     "next: make -f /src/hpo/Makefile status  |  make -f /src/hpo/Makefile report  |  "
     "make -f /src/hpo/Makefile logs TRIAL=7"),
    (False, "sqlite:///hpo.db", "next: hpo-orchestrator status  |  hpo-orchestrator report --out "
                                "report.html  |  hpo-orchestrator logs 7"),
    (True, "sqlite:///other.db", "next: hpo-orchestrator status --storage sqlite:///other.db  |  "
                                 "hpo-orchestrator report --storage sqlite:///other.db --out "
                                 "report.html  |  hpo-orchestrator logs 7 --storage sqlite:///other.db"),
])
def test_1_next_steps_are_typable(monkeypatch: pytest.MonkeyPatch, under_make: bool | str,
                                  storage: str, expected: str) -> None:
    """``under_make``: a string is the Makefile's HPO_MAKE (make -f from another folder)."""
    monkeypatch.setattr(sys, "argv", ["hpo-orchestrator"])
    monkeypatch.delenv("HPO_MAKE", raising=False)
    if isinstance(under_make, str):
        monkeypatch.setenv("HPO_MAKE", under_make)
    if under_make:
        monkeypatch.setenv("MAKELEVEL", "1")
    else:
        monkeypatch.delenv("MAKELEVEL", raising=False)
    assert _cli_trials.next_steps(storage, "sqlite:///hpo.db", 7) == expected


def test_1_next_steps_never_print_a_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAKELEVEL", raising=False)
    line = _cli_trials.next_steps("postgresql+psycopg://me:s3cret@db/hpo", "sqlite:///hpo.db", None)
    # paste-able: the URL without the password, which libpq reads from PGPASSWORD or ~/.pgpass
    assert "s3cret" not in line and "--storage postgresql+psycopg://me@db/hpo " in line
    assert "PGPASSWORD" in line


def test_1_a_venv_path_is_suggested_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before activation the command is not on PATH: suggest the path the user typed."""
    monkeypatch.setattr(sys, "argv", [".venv/bin/hpo-orchestrator"])
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.delenv("MAKELEVEL", raising=False)
    assert _cli_trials.as_typed("run 'hpo-orchestrator logs 0' now", "sqlite:///hpo.db",
                                "sqlite:///hpo.db") == "run '.venv/bin/hpo-orchestrator logs 0' now"
    monkeypatch.setenv("MAKELEVEL", "1")
    monkeypatch.delenv("HPO_MAKE", raising=False)
    assert _cli_trials.as_typed("'hpo-orchestrator logs 0'", "sqlite:///hpo.db",
                                "sqlite:///hpo.db") == "'make logs TRIAL=0'"


# --- 3: a failing objective is no black box -------------------------------------------------


def test_3_fail_fast_stops_on_the_same_error_only() -> None:
    policy = FailurePolicy(fail_fast=3, max_failures=None)
    assert policy.observe(0, True, "exception", "ValueError: x=0.5 is bad", False) is None
    assert policy.observe(1, True, "interrupted", "stopped", False) is None  # ours: not counted
    assert policy.observe(2, True, "exception", "ValueError: x=0.7 is bad", False) is None
    halt = policy.observe(3, True, "exception", "ValueError: x=0.9 is bad", False)
    assert halt is not None
    assert halt.message == ("the first 3 trials all failed with the same error: "
                            "ValueError: x=0.5 is bad (first in trial 0)")
    assert "'hpo-orchestrator logs 0'" in halt.hint and "study.fail_fast=0" in halt.hint
    mixed = FailurePolicy(fail_fast=3, max_failures=None)
    for number, error in enumerate(["A: 1", "B: 2", "A: 3"]):
        assert mixed.observe(number, True, "exception", error, False) is None
    after_success = FailurePolicy(fail_fast=2, max_failures=None)
    after_success.observe(0, False, None, None, False)
    assert after_success.observe(1, True, "exception", "E", False) is None
    assert after_success.observe(2, True, "exception", "E", False) is None


def test_3_max_failures_and_all_failed() -> None:
    policy = FailurePolicy(fail_fast=0, max_failures=1)
    assert policy.observe(0, False, None, None, False) is None
    assert policy.observe(1, True, "oom", "CUDA out of memory", True) is None  # retried: not counted
    assert policy.observe(2, True, "exception", "KeyError: 'a'", False) is None
    halt = policy.observe(3, True, "exception", "KeyError: 'a'", False)
    assert halt is not None and "2 trials failed, more than study.max_failures=1" in halt.message
    assert policy.at_end() is None  # one trial completed
    every = FailurePolicy(fail_fast=5, max_failures=None)
    every.observe(4, True, "exception", "RuntimeError: boom", False)
    end = every.at_end()
    assert end is not None and end.message == ("every trial of this run failed (1): RuntimeError: "
                                               "boom (first in trial 4)")
    # the run spent its budget: the same command alone would find nothing to run
    assert end.hint is not None and "study.add_trials=N" in end.hint
    assert halt.hint is not None and "run the same command again" in halt.hint  # budget left
    assert FailurePolicy(fail_fast=5, max_failures=None).at_end() is None  # nothing ran


def test_3_traceback_keeps_the_objectives_frames() -> None:
    traceback = ('Traceback (most recent call last):\n'
                 '  File "/x/hpo_orchestrator/worker/_child.py", line 97, in run_trial\n'
                 '    value = check_value(objective(trial))\n'
                 '                        ^^^^^^^^^^^^^^^^\n'
                 '  File "/home/me/mypkg/objective.py", line 4, in objective\n'
                 '    raise optuna.TrialPruned()\n'
                 f'{NAME_ERROR}')
    assert user_frames(traceback).splitlines() == [
        "Traceback (most recent call last):", '  File "/home/me/mypkg/objective.py", line 4, in objective',
        "    raise optuna.TrialPruned()", NAME_ERROR]


def test_3_logs_rotate_over_their_cap(tmp_path: Path) -> None:
    log = tmp_path / "trial-0.log"
    with open(log, "ab") as writer:  # the child's O_APPEND handle stays open across a rotation
        writer.write(b"old line\n" * 20)
        writer.flush()
        assert not cap_log(log, 1000)
        assert cap_log(log, 100)
        writer.write(b"new line\n")
        writer.flush()
    assert log.read_bytes() == b"new line\n"  # written at the new end, no hole of zeros
    # only the last cap of bytes is kept (issue 28: a 1.5 GB log was copied whole)
    assert log.with_name("trial-0.log.1").read_bytes() == (b"old line\n" * 20)[-100:]
    assert read_tail(log.with_name("trial-0.log.1"), 2) == ["old line", "old line"]


def test_3_run_folder_beside_the_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_dir(f"sqlite:///{tmp_path}/x/a.db", "my_study") == tmp_path / "x" / "hpo-runs" / "my_study"
    monkeypatch.chdir(tmp_path)
    assert run_dir("postgresql+psycopg://u@h/db", "s") == tmp_path / "hpo-runs" / "s"
    assert run_dir("sqlite:///a.db", "s", str(tmp_path / "logs")) == tmp_path / "logs" / "s"


def _report(**states: int) -> StatusReport:
    from hpo_orchestrator.status._model import StateStats

    return StatusReport(study="s", direction="minimize", n_trials_target=None,
                        states={k: StateStats(count=v) for k, v in states.items()}, prune_rate=0.0,
                        prune_steps={}, best=None, per_device=[], running=[])


def test_3_failing_trials_finding_names_the_common_errors() -> None:
    failures: list[tuple[int, str | None, str | None]] = [
        (0, "exception", "ValueError: lr=0.1 too big"), (2, "exception", "ValueError: lr=0.3 too big"),
        (3, "oom", "CUDA out of memory"), (5, "interrupted", "stopped by SIGINT/SIGTERM")]
    found = find_all(_report(FAIL=4, COMPLETE=1), StudyFacts(
        config={}, max_complete_step=None, unverified=[], mismatches=[], failures=failures))
    finding = next(f for f in found if f.code == "failing_trials")
    # issue 52: grouped by message with its numbers masked (issue 30: no trial is counted
    # under another's text: the group is shown masked, one message quoted whole)
    assert finding.message == ("3 trials failed: 2 x ValueError: lr=# too big (the numbers vary; "
                               "e.g. trial 0: ValueError: lr=0.1 too big); "
                               "1 x CUDA out of memory (e.g. trial 3)")
    failures += [(6, "exception", "KeyError: 'a'"), (7, "exception", "ValueError: lr=0.1 too big")]
    found = find_all(_report(FAIL=6, COMPLETE=1), StudyFacts(
        config={}, max_complete_step=None, unverified=[], mismatches=[], failures=failures))
    finding = next(f for f in found if f.code == "failing_trials")
    assert finding.message.startswith("5 trials failed: 3 x ValueError: lr=# too big")
    assert finding.message.endswith("1 x KeyError: 'a' (e.g. trial 6)")
    failures += [(8, "exception", f"RuntimeError: failed {n}") for n in range(3)] + \
        [(9, "exception", "ZeroDivisionError: division by zero")]
    found = find_all(_report(FAIL=10, COMPLETE=1), StudyFacts(
        config={}, max_complete_step=None, unverified=[], mismatches=[], failures=failures))
    finding = next(f for f in found if f.code == "failing_trials")
    assert finding.message.endswith("; 2 more with 2 other message(s)")
    assert "'hpo-orchestrator logs 0'" in finding.advice
    none = find_all(_report(COMPLETE=1), StudyFacts(config={}, max_complete_step=None,
                                                     unverified=[], mismatches=[], failures=[]))
    assert all(f.code != "failing_trials" for f in none)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


FAILING = ("def objective(trial):\n"
           "    x = trial.suggest_float('x', -10, 10)\n"
           "    print(f'loading data for x={x}')\n"
           "    raise optuna.TrialPruned()\n")


@pytest.mark.slow
def test_3_an_objective_that_always_raises_exits_1_and_its_logs_are_one_command_away(
        tmp_path: Path) -> None:
    _write(tmp_path / "mypkg" / "__init__.py", "")
    _write(tmp_path / "mypkg" / "bad.py", FAILING)
    result = run_cli(tmp_path, "run", "objective=custom", "objective.target=mypkg.bad:objective",
                     "study.n_trials=20", "scheduler.parallel=2")
    assert result.code == 1, result.stderr
    assert f"error: the first 5 trials all failed with the same error: {NAME_ERROR} (first in " \
        "trial " in result.stderr
    assert "hint: " in result.stderr and " logs " in result.stderr and "Traceback" not in result.stderr
    assert f"| {NAME_ERROR}" in result.stdout  # the failing trial's last log lines, live
    assert "failing_trials" in result.stdout
    rows = trial_rows(result.db)
    assert len(rows) < 20  # stopped early
    failed = next(r for r in rows if r["attrs"].get("hpo.fail_reason") == "exception")
    number, attrs = failed["number"], failed["attrs"]
    assert attrs["hpo.traceback"].endswith(NAME_ERROR) and "mypkg/bad.py" in attrs["hpo.traceback"]
    assert "worker/_child.py" not in attrs["hpo.traceback"]
    assert Path(attrs["hpo.log_path"]) == tmp_path / "hpo-runs" / "hpo" / f"trial-{number}.log"
    logs = run_cli(tmp_path, "logs", str(number))
    assert logs.code == 0 and logs.stdout.startswith("loading data for x=")
    assert logs.stdout.rstrip().endswith(NAME_ERROR)
    detail = run_cli(tmp_path, "status", "--trial", str(number))
    assert detail.code == 0 and "failed: exception: " + NAME_ERROR in detail.stdout
    assert "ran on: host=" in detail.stdout and "=None" not in detail.stdout  # none unknown shown
    assert "raise optuna.TrialPruned()" in detail.stdout
    assert (tmp_path / "hpo-runs" / ".gitignore").read_text().endswith("*\n")
    assert not list(tmp_path.glob("*.lock"))  # 10: no lock file beside the database


@pytest.mark.slow
def test_3_reused_workers_split_their_output_per_trial(cli: Any) -> None:
    result = cli("run", "objective=custom", TARGET + "chatty", "study.n_trials=6",
                 "scheduler.parallel=2", "scheduler.worker_mode=reuse", "pruner=none")
    assert result.code == 0, result.stderr
    rows = trial_rows(result.db)
    assert {r["attrs"]["hpo.worker_trial"] for r in rows} > {1}  # workers were reused
    for row in rows:
        text = Path(row["attrs"]["hpo.log_path"]).read_text()
        assert f"chatty trial {row['number']} stdout" in text
        assert f"chatty trial {row['number']} stderr" in text
        assert text.count("chatty trial") == 2, text  # nothing of another trial


def test_3_logs_follow_prints_until_the_trial_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer acts on the follower's polls, not on a clock: a line written while the trial
    runs is printed by a poll that still sees it RUNNING, and the follower stops (saying so)
    once the trial has ended."""
    import threading

    from hpo_orchestrator.cli import _first_hour

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=url, study_name="s")
    trial = study.ask()
    log = tmp_path / "trial-0.log"
    log.write_text("first line\n")
    trial.set_user_attr("hpo.log_path", str(log))

    polls = threading.Condition()
    seen: list[tuple[str, int]] = []  # (state the poll read, bytes printed before it)
    printed = [0]
    read_detail, print_from = _first_hour._detail, _first_hour._print_from

    def counted_print(path: Path, offset: int) -> int:
        new = print_from(path, offset)
        printed[0] += new - offset if new >= offset else new
        return new

    def counted_detail(*args: object) -> object:
        found = read_detail(*args)
        with polls:
            seen.append((found[1]["state"], printed[0]))
            polls.notify_all()
        return found

    def wait_polls(n: int) -> None:
        with polls:
            assert polls.wait_for(lambda: len(seen) >= n, timeout=30), seen

    monkeypatch.setattr(_first_hour, "_FOLLOW_POLL_S", 0.05)
    monkeypatch.setattr(_first_hour, "_detail", counted_detail)
    monkeypatch.setattr(_first_hour, "_print_from", counted_print)

    def writer() -> None:
        wait_polls(2)  # following: the first line printed, a poll done
        with open(log, "a") as handle:
            handle.write("second line\n")
        wait_polls(len(seen) + 2)  # a whole poll after the write: it printed the line
        study.tell(trial, 1.0)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert main(["logs", "0", "--storage", url, "--follow"]) == 0
    finally:
        thread.join()
    out, err = capsys.readouterr()
    assert out == "first line\nsecond line\n" and "trial 0 ended: COMPLETE" in err
    both = len("first line\nsecond line\n")
    assert any(state == "RUNNING" and n == both for state, n in seen), seen  # while it ran
    assert seen[-1][0] == "COMPLETE" and [s for s, _ in seen].count("COMPLETE") == 1


def test_3_logs_of_a_trial_that_printed_nothing_says_so_with_its_outcome(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 30: `make logs TRIAL=3` for the default study's silent trials printed nothing."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=url, study_name="s")
    for number, tell in enumerate([0.25, None, "fail"]):
        trial = study.ask()
        log = tmp_path / f"trial-{number}.log"
        log.write_text("")
        trial.set_user_attr("hpo.log_path", str(log))
        if tell == "fail":
            trial.set_user_attr("hpo.fail_reason", "oom")
            trial.set_user_attr("hpo.error", "MemoryError: out of memory")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif tell is not None:
            study.tell(trial, tell)
    said = []
    for number in range(3):
        assert main(["logs", str(number), "--storage", url]) == 0
        out, err = capsys.readouterr()
        assert out == ""
        said.append(err)
    assert f"trial 0 of study 's' printed nothing (its log {tmp_path / 'trial-0.log'} is empty); " \
        "it ended COMPLETE, value 0.25" in said[0]
    assert "trial 1 of study 's' printed nothing" in said[1] and "still RUNNING" in said[1] \
        and "logs 1 --follow" in said[1]
    assert "it ended FAIL: oom: MemoryError: out of memory" in said[2]


# --- 2: the current folder is importable ----------------------------------------------------


def test_2_current_folder_importable_for_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config import load_config
    from hpo_orchestrator.runner import check_objective

    _write(tmp_path / "herepkg" / "obj.py", "def objective(trial):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    check_objective(load_config(["objective=custom", "objective.target=herepkg.obj:objective"]))
    assert str(tmp_path) in sys.path


# --- 4: the last step is never pruned -------------------------------------------------------


class _PruneAlways:
    """A trial proxy whose pruner always says prune."""

    def __init__(self) -> None:
        self.number = 0
        self.params: dict[str, Any] = {}
        self.attrs: dict[str, Any] = {}
        self.steps: list[int] = []

    def suggest_int(self, name: str, low: int, high: int, **_: Any) -> int:
        return self.params.setdefault(name, low)

    def suggest_float(self, name: str, low: float, high: float, **_: Any) -> float:
        return self.params.setdefault(name, low)

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        return self.params.setdefault(name, choices[0])

    def set_user_attr(self, key: str, value: Any) -> None:
        self.attrs[key] = value

    def report(self, value: float, step: int) -> None:
        self.steps.append(step)

    def should_prune(self) -> bool:
        return True


def test_4_lightgbm_completes_at_its_last_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    objective = LightGBMObjective(LightGBMObjectiveConfig(n_rows=200, n_features=4, num_boost_round=10,
                                                          report_every=10))
    trial = _PruneAlways()
    assert isinstance(objective(trial), float)  # one step, the last: completes
    assert trial.steps == [1]
    longer = LightGBMObjective(LightGBMObjectiveConfig(n_rows=200, n_features=4, num_boost_round=20,
                                                       report_every=10))
    with pytest.raises(optuna.TrialPruned):
        longer(_PruneAlways())  # step 1 of 2 is still pruned


def test_4_torch_completes_at_its_last_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from hpo_orchestrator.config._schema import TorchMLPObjectiveConfig
    from hpo_orchestrator.objectives.torch_mlp import TorchMLPObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    trial = _PruneAlways()
    assert isinstance(TorchMLPObjective(TorchMLPObjectiveConfig(n_samples=64, n_features=4, epochs=1,
                                                                batch_size=32))(trial), float)
    with pytest.raises(optuna.TrialPruned):
        TorchMLPObjective(TorchMLPObjectiveConfig(n_samples=64, n_features=4, epochs=2,
                                                  batch_size=32))(_PruneAlways())


def test_10_lightgbm_params_effective_is_compact_and_keeps_the_suggested(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo_orchestrator.config._schema import LightGBMObjectiveConfig
    from hpo_orchestrator.objectives.lightgbm import LightGBMObjective

    monkeypatch.setenv("HPO_NUM_THREADS", "1")
    class AtDefaults(_PruneAlways):
        def suggest_float(self, name: str, low: float, high: float, **_: Any) -> float:
            return self.params.setdefault(name, high)  # feature_fraction=1.0: LightGBM's default

    trial = AtDefaults()
    LightGBMObjective(LightGBMObjectiveConfig(n_rows=200, n_features=4, num_boost_round=10))(trial)
    effective = trial.attrs["hpo.params_effective"]
    assert len(effective) < 40  # LightGBM's block has ~100 keys
    assert {"device_type", "num_threads", "lightgbm_version"} <= set(effective)
    assert effective["feature_fraction"] == 1.0  # suggested, at the default: kept
    # every suggested name LightGBM's block uses (min_child_samples it calls min_data_in_leaf)
    assert set(trial.params) - {"min_child_samples"} <= set(effective)
    assert "min_data_in_leaf" in effective


# --- 5: a finished study rerun; 6: another objective in it ---------------------------------


@pytest.mark.slow
def test_5_rerun_says_complete_and_add_trials_runs_more(cli: Any) -> None:
    args = ("run", "objective=custom", TARGET + "quadratic", "study.n_trials=3")
    assert cli(*args).code == 0
    again = cli(*args)
    assert again.code == 0
    assert "already has 3 of its study.n_trials=3 trials: nothing to run" in again.stdout
    assert "study.add_trials=20" in again.stdout
    more = cli(*args, "study.add_trials=2")
    assert more.code == 0, more.stderr
    assert "n_trials 5 (3 done before)" in more.stdout
    assert len(trial_rows(more.db)) == 5
    # the first command again: it says how many there are, and leaves the study's record (it
    # recorded n_trials=3, and status then called 2 of the run's trials 'outside the runs')
    last = cli(*args)
    assert "already has 5 trials, more than its study.n_trials=3: nothing to run" in last.stdout
    status = cli("status")
    assert "finished 5 of 5" in status.stdout and "outside" not in status.stdout, status.stdout


def test_5_a_run_with_add_trials_is_resumed_with_its_total(monkeypatch: pytest.MonkeyPatch) -> None:
    """add_trials is resolved at each start: 'the same command again' would add N more again."""
    monkeypatch.delenv("MAKELEVEL", raising=False)
    overrides = ["study.name=x", "study.add_trials=4"]
    hint = _cli_trials.resume_hint(overrides, 4, 7)
    assert "study.n_trials=7'" in hint and "study.add_trials=4 would add 4 more again" in hint
    assert "study.add_trials=4 study" not in hint and "study.name=x" in hint
    assert _cli_trials.resume_hint(["study.n_trials=9"], None, 9) == "run the same command again"


@pytest.mark.slow
def test_5_a_timed_out_add_trials_run_says_how_to_continue(cli: Any) -> None:
    ran = cli("run", "objective=custom", TARGET + "sleepy", "study.add_trials=4", "study.timeout_s=1",
              env={"HPO_TEST_SLEEP_S": "2"})
    assert ran.code == 0, ran.stderr
    # under make (as CI runs it) the command reads `make hpo ARGS="... study.n_trials=4"`
    assert "time limit reached" in ran.stdout and "study.n_trials=4" in ran.stdout
    assert "(the same command with study.add_trials=4 would add 4 more again) to continue" in ran.stdout


@pytest.mark.slow
def test_6_another_objective_is_refused_unless_allowed(cli: Any) -> None:
    assert cli("run", "objective=custom", TARGET + "quadratic", "study.n_trials=2").code == 0
    mixed = cli("run", "objective=custom", TARGET + "curves", "study.n_trials=3")
    assert mixed.code == 2
    assert mixed.stderr.startswith("error: study 'hpo' was run with another objective (objective.target: "
                                   "'tests.objectives:quadratic' -> ")
    assert "study.allow_mixed=true" in mixed.stderr and len(trial_rows(mixed.db)) == 2
    allowed = cli("run", "objective=custom", TARGET + "curves", "study.n_trials=3", "study.allow_mixed=true")
    assert allowed.code == 0 and len(trial_rows(allowed.db)) == 3


def test_6_what_counts_as_another_objective() -> None:
    lightgbm = {"name": "lightgbm", "n_rows": 100, "device": "auto", "seed": 0}
    assert objective_differences(lightgbm, {**lightgbm, "device": "cpu"}) == []  # where, not what
    assert objective_differences(lightgbm, {**lightgbm, "n_rows": 200}) == ["objective.n_rows: 100 -> 200"]
    assert objective_differences(lightgbm, {"name": "custom", "target": "m:f"}) == [
        "objective: 'lightgbm' -> 'custom'"]
    assert objective_differences(None, lightgbm) == []
    assert objective_differences(lightgbm, {**lightgbm, "new_key": 1}) == []  # another release's key


# --- 7: queued trials, slow_startup; 8: the latest study ------------------------------------


def _study_with_queued(path: Path) -> None:
    storage = f"sqlite:///{path}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=storage, study_name="old")
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0))
    study = optuna.create_study(storage=storage, study_name="new")
    study.set_user_attr("hpo.config", {"scheduler": {"worker_mode": "reuse"}})
    on_slot, asked_ahead = study.ask(), study.ask()
    on_slot.set_user_attr("hpo.host", "h")
    on_slot.set_user_attr("hpo.slot", 0)
    asked_ahead.set_user_attr("hpo.host", "h")  # written at the ask, before any slot took it
    study.set_user_attr("hpo.pruner.min_resource_auto", {"min_resource": 7, "at_trial": 3,
                                                          "reason": "start-up 2.00 s"})


def test_7_8_queued_trials_min_resource_and_the_latest_study(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _study_with_queued(tmp_path / "hpo.db")
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["status", "--storage", url]) == 0
    out, err = capsys.readouterr()
    assert ("study 'new': the most recently run of 2 in this storage (--study NAME for another: "
            "old, new)") in err
    assert "queued (asked ahead of a free slot, no process yet): #1" in out
    assert "pruner.min_resource=auto chose 7 (at trial 3): start-up 2.00 s" in out
    assert main(["status", "--storage", url, "--json"]) == 0
    data = __import__("json").loads(capsys.readouterr().out)
    assert data["states"]["RUNNING"]["count"] == 1 and data["states"]["QUEUED"]["count"] == 1
    assert [r["number"] for r in data["running"]] == [0] and data["queued"] == [1]
    assert main(["status", "--storage", url, "--study", "old"]) == 0
    assert "most recently" not in capsys.readouterr().err


@pytest.mark.parametrize(("config", "startup", "advice_has", "advice_lacks"), [
    ({"scheduler": {"worker_mode": "reuse"}, "pruner": {"min_resource": 3}}, 3.0,
     "raise pruner.min_resource (now 3)", "worker_mode"),
    ({"scheduler": {"worker_mode": "fresh"}, "pruner": {"min_resource": "auto"}}, 3.0,
     "set scheduler.worker_mode=reuse (now fresh)", "set pruner.min_resource=auto"),
    ({"scheduler": {"worker_mode": "reuse"}, "pruner": {"min_resource": 3}}, 0.05, None, None),
])
def test_7_slow_startup_has_a_floor_and_advice_that_applies(config: dict[str, Any], startup: float,
                                                            advice_has: str | None,
                                                            advice_lacks: str | None) -> None:
    found = [f for f in find_all(_report(COMPLETE=4), StudyFacts(
        config=config, startup=(4, startup, startup * 2), max_complete_step=None, unverified=[],
        mismatches=[])) if f.code == "slow_startup"]
    if advice_has is None:
        assert found == []  # 50 % of the time, but 0.05 s: not worth a finding
        return
    assert len(found) == 1 and advice_has in found[0].advice
    assert advice_lacks not in found[0].advice


# --- 9: progress ----------------------------------------------------------------------------


def test_9_progress_says_done_eta_and_the_studys_best() -> None:
    from hpo_orchestrator.cli._progress import LiveReporter
    from hpo_orchestrator.scheduler import FinishedTrial

    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with LiveReporter(console, 10, 4, "minimize", best=(2, 0.125)) as reporter:
        reporter.finished(FinishedTrial(number=5, slot="cpu0", state=TrialState.COMPLETE,
                                        value=0.5, duration_s=1.0))
    bar = out.getvalue().splitlines()[-1]
    assert "5/10 this run: complete 1, pruned 0, failed 0  best 0.125 (#2)" in bar
    assert "eta" in bar and "complete 5" not in bar


# --- 10: the small ones ---------------------------------------------------------------------


def test_10_version_help_and_unwrapped_output(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("hpo-orchestrator ")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "objective=lightgbm|torch_mlp|custom" in text and "study.add_trials=N" in text
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    assert "seconds between refreshes" in capsys.readouterr().out


def test_10_a_pipe_is_not_wrapped_at_80_columns(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    long_name = "a-database-name-" + "x" * 90 + ".db"
    proc = subprocess.run([sys.executable, "-m", "hpo_orchestrator", "status", "--storage",
                           f"sqlite:///{tmp_path / long_name}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 2  # error + hint, each one line however long
    assert long_name in proc.stderr.splitlines()[0]


def test_10_best_params_print_as_they_paste() -> None:
    from hpo_orchestrator.status._output import _fmt

    assert _fmt(0.123456789012) == "0.123456789012"
    assert _fmt(3) == "3" and _fmt("gbdt") == "gbdt" and _fmt("a b") == "'a b'"


def test_10_readme_sql_per_gpu_is_filtered_by_study() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("-- trials per GPU and state"):]
    block = block[:block.index(";")]
    assert "study_name = 'hpo'" in block


# --- 11: the CPU torch ----------------------------------------------------------------------


def test_11_torch_comes_from_the_cpu_index_with_a_fallback() -> None:
    dry = subprocess.run(["make", "-n", "install", "VENV=/nonexistent/venv"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    cpu = dry.index('--index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0"')
    fallback = dry.index('pip install -q "torch==2.13.0"', cpu)
    assert cpu < fallback and "||" in dry[cpu:fallback]


def test_9_counts_add_up_across_an_interrupt_and_its_resume(tmp_path: Path) -> None:
    """issue 30: 'finished 25 of 20' after a resume, a bar that counted interrupted attempts,
    and a wall time holding the gap between the runs."""
    from hpo_orchestrator.cli._progress import LiveReporter
    from hpo_orchestrator.scheduler import FinishedTrial
    from hpo_orchestrator.status import collect_status, render_status

    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with LiveReporter(console, 4, 2, "minimize") as reporter:
        for number, retried in [(5, True), (6, False), (7, False), (8, False)]:
            reporter.finished(FinishedTrial(
                number=number, slot="cpu0", state=TrialState.FAIL if retried else TrialState.COMPLETE,
                value=None if retried else 1.0, duration_s=1.0,
                fail_reason="interrupted" if retried else None, retried=retried))
    bar = out.getvalue().splitlines()[-1]
    assert "4/4 this run: complete 3, pruned 0, failed 0, re-run 1" in bar  # never past 4

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=url, study_name="s")
    study.set_user_attr("hpo.config", {"study": {"n_trials": 3}})
    start = datetime(2026, 1, 1, 12, 0, 0)
    for at, state in [(0, "COMPLETE"), (1, "FAIL"), (60, "COMPLETE"), (61, "COMPLETE")]:
        trial = optuna.trial.create_trial(
            state=getattr(optuna.trial.TrialState, state), value=1.0 if state == "COMPLETE" else None,
            user_attrs={"hpo.host": "h", "hpo.pid": 11, "hpo.fail_reason": "interrupted",
                        "hpo.retried": True}
            if state == "FAIL" else {"hpo.host": "h"})
        trial.datetime_start = start + timedelta(seconds=at)
        trial.datetime_complete = start + timedelta(seconds=at + 2)
        study.add_trial(trial)
    from hpo_orchestrator.db.connect import create_engine

    report = collect_status(create_engine(url), "s")
    assert report.retried == 1 and report.wall_s == 63 and report.active_s == 6  # 0-3 s and 60-63 s
    text = io.StringIO()
    Console(file=text, width=300).print(render_status(report))
    line = text.getvalue().splitlines()[0]
    assert "finished 3 of 3 (+1 attempt re-run: interrupted or retried)" in line
    assert "wall 6 s with trials running (63 s from the first start, gaps between runs included)" in line


def test_3_a_repeated_error_shows_its_traceback_once(tmp_path: Path) -> None:
    """issue 30: fail-fast's five trials, failing alike, printed the same traceback five
    times; the later ones name the first, and another error still shows its own."""
    from hpo_orchestrator.cli._progress import LiveReporter
    from hpo_orchestrator.scheduler import FinishedTrial

    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    errors = ["ValueError: boom"] * 3 + ["KeyError: 'x'"]
    with LiveReporter(console, 10, 0, "minimize") as reporter:
        for number, error in enumerate(errors):
            log = tmp_path / f"trial-{number}.log"
            log.write_text(f"Traceback (most recent call last):\n  in trial {number}\n{error}\n")
            reporter.finished(FinishedTrial(number=number, slot="cpu0", state=TrialState.FAIL,
                                            value=None, duration_s=0.1, fail_reason="exception",
                                            error=error, log_path=str(log)))
    text = out.getvalue()
    assert text.count("| Traceback (most recent call last):") == 2  # boom once, KeyError once
    assert "in trial 0" in text and "in trial 1" not in text and "in trial 3" in text
    assert text.count("(the same error as trial 0, shown above)") == 2
