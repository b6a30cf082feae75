"""Issue 28's smaller trust items: what status and report do with a study they did not expect
(``parallel=auto``, malformed attrs, a bug of ours), and how objective values are judged."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from hpo_orchestrator.cli import main
from hpo_orchestrator.db import read_errors
from hpo_orchestrator.errors import StorageError
from hpo_orchestrator.status._findings import find_all
from hpo_orchestrator.status._model import DeviceUse, StateStats, StatusReport, StudyFacts
from tests.conftest import run_cli

TARGET = "objective.target=tests.objectives:"


def _idle_report() -> StatusReport:
    idle = [DeviceUse(device=f"gpu{i}", host="h", gpu_index=i, trials=3, busy_fraction=0.1,
                      busy_fraction_queued=0.1, active_s=600.0, active_queued_s=600.0)
            for i in range(2)]
    return StatusReport(study="s", direction="minimize", n_trials_target=None,
                        states={"COMPLETE": StateStats(count=6)}, prune_rate=0.0, prune_steps={},
                        best=None, per_device=idle, running=[])


@pytest.mark.parametrize("parallel", ["auto", 1, None])
def test_14_idle_gpu_finding_takes_parallel_auto(parallel: object) -> None:
    """`scheduler.parallel=auto` is stored as the text 'auto': compared with a number it
    crashed status and report after every such run on a GPU host."""
    facts = StudyFacts(config={"scheduler": {"parallel": parallel}},
                       max_complete_step=None, unverified=[], mismatches=[])
    idle = [f for f in find_all(_idle_report(), facts) if f.code == "idle_gpu"]
    assert len(idle) == 1  # issue 30: one finding naming the GPUs, not one per GPU
    assert "2 GPUs were busy under 75% of the time with trials running: gpu0 10% (10% while " \
        "trials waited to start; 3 trials), gpu1 10% (10% while trials waited to start; 3 " \
        "trials)" == idle[0].message
    assert [d["device"] for d in idle[0].evidence["devices"]] == ["gpu0", "gpu1"]
    assert ("fewer trials than this host has GPUs" in idle[0].advice) == (parallel == 1)


def test_14_read_errors_keeps_a_bug_a_bug() -> None:
    """Only the storage's errors are the storage's; a bug of ours keeps its type and traceback."""
    with pytest.raises(TypeError), read_errors():
        raise TypeError("'<' not supported between instances of 'str' and 'int'")
    with pytest.raises(StorageError, match="cannot read the storage") as caught, read_errors():
        raise sqlite3.OperationalError("no such table: studies")
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)  # --debug shows it


def _tiny_study(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    return url


def test_14_a_bug_under_status_is_unexpected_not_a_storage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = _tiny_study(tmp_path)

    def broken(*_: object, **__: object) -> list[object]:
        raise TypeError("'<' not supported between instances of 'str' and 'int'")

    monkeypatch.setattr("hpo_orchestrator.status._collect.find_all", broken)
    assert main(["status", "--storage", url]) == 1
    err = capsys.readouterr().err
    assert "error: unexpected TypeError" in err and "report it" in err
    assert "is it an Optuna database" not in err
    assert main(["--debug", "status", "--storage", url]) == 1
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.slow
def test_14_status_and_report_after_parallel_auto_on_fake_gpus(tmp_path: Path) -> None:
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": json.dumps({"gpus": [{"busy_util": 40}] * 3})}
    result = run_cli(tmp_path, "run", "objective=custom", TARGET + "quadratic",
                     "scheduler.parallel=auto", "study.n_trials=4", env=env)
    assert result.code == 0, result.stderr
    status = run_cli(tmp_path, "status", env=env)
    assert status.code == 0, status.stderr
    report = run_cli(tmp_path, "report", "--out", str(tmp_path / "r.html"), env=env)
    assert report.code == 0, report.stderr


# --- 13: malformed attrs, and which values a trial may return ---------------------------------

MALFORMED = {"hpo.pruner.min_resource_auto": "<b>3</b>", "hpo.config": {"scheduler": "auto"},
             "hpo.devices.h": 5, "hpo.packing.h": {"mode": "auto", "levels": ["x"]},
             "hpo.device_choice.h": {"learner": "cpu", "reason": "r",
                                     "learners": {"0": {"cpu": "many"}}}}


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["report", "--out", "r.html"]],
                         ids=" ".join)
def test_13_a_malformed_hpo_attr_is_named_never_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: list[str]) -> None:
    url = _tiny_study(tmp_path)
    study = optuna.load_study(study_name="s", storage=url)
    for key, value in MALFORMED.items():
        study.set_user_attr(key, value)
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--storage", url]) == 0, capsys.readouterr().err
    if args[0] == "status":
        out = capsys.readouterr().out
        assert "unreadable_attr" in out and all(key in out for key in MALFORMED)


def test_13_values_are_taken_as_plain_optuna_takes_them_but_inf() -> None:
    """Plain Optuna completes a trial returning True, np.True_ or inf (as 1.0, 1.0, inf) and
    fails NaN; we take the same but inf (README, Reliability)."""
    from hpo_orchestrator.worker._child import check_value

    for value in (True, np.bool_(True), np.int64(1), 1):
        study = optuna.create_study()
        study.optimize(lambda _t, v=value: v, n_trials=1)  # type: ignore[misc]
        assert study.trials[0].value == check_value(value) == 1.0
    assert check_value(np.bool_(False)) == check_value(False) == 0.0
    for value in (float("inf"), -np.inf, float("nan"), "1", None):
        with pytest.raises(ValueError):
            check_value(value)


# --- 11: control characters from a trial or the database are shown, never obeyed ---------------

OSC = "\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x9b2J\x1b[2J"
CONTROLS = ("\x1b", "\x07", "\x9b")


def test_11_printable_keeps_text_newlines_and_tabs() -> None:
    from hpo_orchestrator.cli._common import printable

    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("x" + OSC) == "x\ufffd]0;pwned\ufffd\ufffd]52;c;ZXZpbA==\ufffd\ufffd2J\ufffd[2J"


def test_11_every_console_print_passes_through_printable() -> None:
    """A table cell, a Text and a plain string alike; rich's own styling escapes still work."""
    import io

    from rich.table import Table
    from rich.text import Text

    from hpo_orchestrator.cli._common import _Console

    out = io.StringIO()
    console = _Console(file=out, force_terminal=True, width=200)
    table = Table()
    table.add_column("param" + OSC)
    table.add_row("value" + OSC)
    console.print(table)
    console.print(Text("error" + OSC, style="bold red"), "plain" + OSC)
    shown = out.getvalue()
    assert "\x1b[1;31m" in shown  # rich's style
    assert "]0;pwned" in shown and "\x1b]" not in shown and "\x07" not in shown
    assert "\x9b" not in shown and "\x1b[2J" not in shown


@pytest.mark.slow
def test_11_an_objectives_escape_sequences_never_reach_the_terminal(tmp_path: Path) -> None:
    (tmp_path / "evil.py").write_text(
        "def objective(trial):\n"
        f"    trial.suggest_float({'x' + OSC!r}, 0, 1)\n"
        f"    print({'log' + OSC!r})\n"
        f"    raise ValueError({'boom' + OSC!r})\n")
    result = run_cli(tmp_path, "run", "objective=custom", "objective.target=evil:objective",
                     "study.n_trials=2", "study.fail_fast=0")
    assert "boom" in result.stdout + result.stderr
    for args in (["status"], ["status", "--trial", "0"], ["logs", "0"]):
        shown = run_cli(tmp_path, *args)
        assert shown.code == 0, shown.stderr
        assert "pwned" in shown.stdout + shown.stderr, args
        outputs = [result.stdout, result.stderr, shown.stdout, shown.stderr]
        assert not any(c in out for c in CONTROLS for out in outputs), args


# --- 9: a full artifact store keeps no partial file ----------------------------------------------


class _Link:
    def __init__(self, reply: tuple[str, Any]) -> None:
        self.reply = reply

    def call(self, _number: int, _frame: Any) -> tuple[str, Any]:
        return self.reply


@pytest.mark.parametrize("failure", [OSError, KeyboardInterrupt])
def test_9_a_failed_save_artifact_leaves_no_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]) -> None:
    import errno

    from optuna.artifacts import FileSystemArtifactStore

    from hpo_orchestrator import save_artifact
    from hpo_orchestrator.worker import _runtime as runtime
    from hpo_orchestrator.worker._proxy import TrialProxy

    store, model = tmp_path / "store", tmp_path / "model.bin"
    store.mkdir()
    model.write_bytes(b"w" * 100_000)
    real_write = FileSystemArtifactStore.write

    def full(self: FileSystemArtifactStore, artifact_id: str, content_body: Any) -> None:
        (store / artifact_id).write_bytes(content_body.read(4096))  # what fit before ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device") if failure is OSError else failure()

    monkeypatch.setattr(FileSystemArtifactStore, "write", full)
    link = _Link(("ok", None))
    monkeypatch.setattr(runtime, "_connection", link)
    monkeypatch.setattr(runtime, "_artifact_store", str(store))
    with pytest.raises(failure, match="No space left" if failure is OSError else None):
        save_artifact(TrialProxy(link, 0), model)  # type: ignore[arg-type]
    assert list(store.iterdir()) == []
    monkeypatch.setattr(FileSystemArtifactStore, "write", real_write)  # and a later save works
    artifact_id = save_artifact(TrialProxy(link, 0), model)  # type: ignore[arg-type]
    assert (store / artifact_id).read_bytes() == model.read_bytes()
