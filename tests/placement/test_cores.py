"""Other runs on this run's cores are said and recorded, not leased (placement/_cores.py,
docs/HOSTS.md "Several runs on one host's cores").

The other run is a real process holding its presence in the lease folder, so who it is comes
from the kernel (its lock's pid in /proc/locks), as for GPU leases; its end is the process's
end, and the next look says the cores are free again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpo_orchestrator import keys
from hpo_orchestrator.placement import CoreShare, LeaseDir
from hpo_orchestrator.placement._cores import sharing
from tests.conftest import cli_env

# Another run: announces its cores (or plants a note it could not have written: ``note``
# replaces the file's content after the lock), says so, and holds them until stdin closes.
_OTHER = """
import json, os, sys
from pathlib import Path
from hpo_orchestrator.placement import LeaseDir

lease_dir, note, forged = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
lease = LeaseDir(lease_dir).announce_cores(**note)
if forged:
    os.ftruncate(lease.fd, 0)
    os.pwrite(lease.fd, json.dumps({**note, "pid": 1}).encode(), 0)
print(json.dumps({"pid": os.getpid()}), flush=True)
sys.stdin.read()
"""


@contextmanager
def _other_run(lease_dir: Path, forged: bool = False, **note: Any) -> Iterator[int]:
    """A run of another process on the cores ``note`` names; its pid."""
    note = {"study": "other", "cpus": [0, 1], "trials": 2, "threads": 1, "wanted": 2, **note}
    proc = subprocess.Popen([sys.executable, "-c", _OTHER, str(lease_dir), json.dumps(note),
                             "1" if forged else "0"], env=cli_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        yield int(json.loads(line)["pid"])
    finally:
        proc.communicate(input="", timeout=60)


class _Study:
    """What the run's study attrs are to CoreShare.record (an optuna.Study's two members)."""

    def __init__(self) -> None:
        self.user_attrs: dict[str, Any] = {}

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = json.loads(json.dumps(value))  # as the storage keeps it


def _share(lease_dir: Path, cpus: set[int] | None = None, trials: int = 2) -> CoreShare:
    share = CoreShare(LeaseDir(lease_dir), cpus or {0, 1}, trials, 1, "mine", "h1")
    share.announce()
    return share


def test_a_run_on_the_same_cores_is_named_by_the_kernels_pid_until_it_ends(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    share, study = _share(lease_dir), _Study()
    try:
        with _other_run(lease_dir) as pid:
            assert share.check(now=0.0)
            share.record(study)
            [note] = share.take_notes()
            assert note.startswith(f"another hpo-orchestrator run (pid {pid}, uid {os.getuid()} ")
            assert "study 'other') is using 2 of " in note and "this run's trials use 2" in note
            assert "trials will share cores and run slower" in note
            assert "scheduler.host_cores=1 in each" in note  # 2 cores, 2 runs, none free
            assert not share.check(now=1.0)  # read every few seconds, not every loop round
            assert not share.check(now=10.0) and share.take_notes() == []  # said once
        assert share.check(now=20.0)
        share.record(study)
        assert share.take_notes() == ["no other hpo-orchestrator run uses this run's cores any "
                                      "more: its trials have them to themselves again"]
    finally:
        share.close()
    recorded = study.user_attrs[keys.SHARED_CORES_PREFIX + "h1"]
    assert recorded["until"] is not None and recorded["since"] <= recorded["until"]
    assert recorded["cores"] == 2 and recorded["wanted"] == 2
    assert [(o["pid"], o["study"], o["cores"]) for o in recorded["others"]] == [(pid, "other", 2)]
    assert keys.well_formed(keys.SHARED_CORES_PREFIX + "h1", recorded)
    # its own presence withdrawn; the other's left by a run that exited without withdrawing it,
    # as one killed does (removed by a later look once it is stale)
    assert [p.name.split("-")[0] for p in lease_dir.iterdir()] == [f"cores.{pid}"]


def test_runs_that_fit_in_the_cores_or_run_on_others_say_nothing(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    share = _share(lease_dir, cpus={0, 1, 2, 3}, trials=2)
    try:
        with _other_run(lease_dir, cpus=[0, 1, 2, 3], wanted=2):  # 2 + 2 of 4 cores
            assert not share.check(now=0.0) and share.users == []
        with _other_run(lease_dir, cpus=[4, 5, 6, 7], trials=4, wanted=4):  # taskset apart
            assert not share.check(now=10.0) and share.users == []
        with _other_run(lease_dir, cpus=[0, 1, 2, 3], trials=3, wanted=3):  # 2 + 3 of 4
            assert share.check(now=20.0)
            assert [u.cores for u in share.users] == [3]
            assert "run this one with scheduler.host_cores=1, as many as are free" \
                in share.take_notes()[0]
    finally:
        share.close()


def test_only_the_cores_both_runs_may_use_count() -> None:
    other = {"pid": 7, "uid": 0, "study": "b", "cpus": [2, 3, 4, 5], "trials": 4, "wanted": 4}
    # this run: CPUs 0-3, 3 cores wanted; the other keeps busy at most its CPUs 2 and 3 of them
    assert [(u.pid, u.cores) for u in sharing({0, 1, 2, 3}, 3, [other])] == [(7, 2)]
    assert sharing({0, 1, 2, 3}, 2, [other]) == []  # 2 + 2 of 4


def test_a_note_that_could_be_forged_or_is_not_ours_counts_as_no_run(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    share = _share(lease_dir)
    try:
        with _other_run(lease_dir, forged=True):  # its note names a pid the kernel does not
            assert not share.check(now=0.0) and share.users == []
        with _other_run(lease_dir, wanted="all", cpus="0-1"):  # a shape we never write
            assert not share.check(now=10.0) and share.users == []
    finally:
        share.close()


def test_a_dead_runs_presence_is_removed_and_a_starting_ones_kept(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    share = _share(lease_dir)
    try:
        dead, starting = lease_dir / "cores.1-dead.lock", lease_dir / "cores.2-new.lock"
        for path in (dead, starting):
            path.write_text(json.dumps({"pid": 1, "study": "x", "cpus": [0, 1], "trials": 2,
                                        "wanted": 2}))
        past = time.time() - 60
        os.utime(dead, (past, past))  # unlocked for a minute: its run is gone
        assert not share.check(now=0.0) and share.users == []
        assert not dead.exists() and starting.exists()  # unlocked yet: about to be locked
    finally:
        share.close()


def test_a_lease_folder_that_cannot_be_used_is_said_once_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "leases").write_text("")  # a file where the folder should be
    share = _share(tmp_path / "leases")
    [note] = share.take_notes()
    assert note.endswith("this run cannot see other hpo-orchestrator runs on this host's cores, "
                         "nor they it")
    assert "is not a folder" in note
    assert not share.active and not share.check(now=0.0) and share.take_notes() == []
    share.close()


def test_a_run_without_cpu_trials_announces_nothing(tmp_path: Path) -> None:
    share = _share(tmp_path / "leases", trials=0)
    assert not share.active and not (tmp_path / "leases").exists()
    share.close()
