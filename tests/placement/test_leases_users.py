"""Two users of one host share the GPU lease folder (docs/DESIGN.md §3.2, placement/_leases.py).

Each user is a real uid: a root-started interpreter imports the package, then drops to the
uid (setresuid) before it touches the folder, since the test's interpreter and virtual
environment may sit where another uid cannot read (CI's /root). Root skips permission checks,
so both users are unprivileged uids. Skipped unless the test runs as root; required in CI
(HPO_TEST_REQUIRE_ROOT=1).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli_env

USER_A, USER_B = 61001, 61002

_AS_USER = """
import json, os, sys
from pathlib import Path
from hpo_orchestrator.errors import ConfigError
from hpo_orchestrator.placement import LeaseDir

uid, lease_dir, script = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
os.umask(0o022)  # the usual umask, which cut the modes mkdir and open asked for
leases = LeaseDir(lease_dir)
out = {}
exec(script)
print(json.dumps(out))
"""

# User A: its run makes the folder, takes and frees slot 0 (its note written), holds slot 1.
_FIRST = """
leases.check()
lease = leases.try_acquire("GPU-t", 0)
lease.describe(study="a", trial=0)
lease.release()
held = leases.try_acquire("GPU-t", 1)
held.describe(study="a", trial=1)
out["held"] = True
print(json.dumps(out), flush=True)
sys.stdin.read()  # hold slot 1 until the test closes stdin
"""

# User B, after A: slot 0 (A's file) is free, slot 1 is A's, slot 2 is new.
_SECOND = """
try:
    leases.check()
except ConfigError as exc:
    out["check"] = [exc.message, exc.hint]
    raise SystemExit(print(json.dumps(out)))
free = leases.try_acquire("GPU-t", 0)
out["slot0"] = free is not None
if free is not None:
    free.describe(study="b", trial=5)
out["slot1"] = leases.try_acquire("GPU-t", 1) is not None
new = leases.try_acquire("GPU-t", 2)
out["slot2"] = new is not None
leases.wait_for("GPU-t")
out["waited_longer"] = leases.waited_longer("GPU-t")
out["holders"] = {str(k): [v.get("uid"), v.get("study")]
                  for k, v in leases.holders("GPU-t").items()}
leases.stop_waiting()
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp that both uids can write to (pytest's tmp_path is root's, mode 700)."""
    if os.geteuid() != 0:
        reason = "needs root to run as two other users (CI runs it: HPO_TEST_REQUIRE_ROOT=1)"
        if os.environ.get("HPO_TEST_REQUIRE_ROOT") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="hpo-leases-"))
    base.chmod(0o1777)  # as /tmp, where the default lease folder is made
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _as_user(uid: int, lease_dir: Path, script: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _AS_USER, str(uid), str(lease_dir), script],
                            env=cli_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def _second(lease_dir: Path) -> dict[str, object]:
    import json

    proc = _as_user(USER_B, lease_dir, _SECOND)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    result: dict[str, object] = json.loads(stdout)
    return result


def test_a_second_user_takes_free_slots_after_the_first_made_the_folder(shared_tmp: Path) -> None:
    import json

    lease_dir = shared_tmp / "leases"
    first = _as_user(USER_A, lease_dir, _FIRST, stdin=subprocess.PIPE)
    try:
        assert first.stdout is not None
        assert json.loads(first.stdout.readline()) == {"held": True}
        assert stat.S_IMODE(lease_dir.stat().st_mode) == 0o1777
        # only its owner writes a lease file: no one else can forge who holds it
        assert stat.S_IMODE((lease_dir / "GPU-t.0.lock").stat().st_mode) == 0o644
        second = _second(lease_dir)
    finally:
        first.communicate(input="", timeout=60)
    # B holds slot 0 in A's file (read-only: no note of B's there) and slot 2 (no note yet);
    # each holder's uid is the kernel's, and A's own note names its study
    assert second == {"slot0": True, "slot1": False, "slot2": True, "waited_longer": False,
                      "holders": {"0": [USER_B, None], "1": [USER_A, "a"],
                                  "2": [USER_B, None]}}


def test_a_folder_made_by_an_older_version_is_opened_to_all_by_its_owner(shared_tmp: Path) -> None:
    """The folder and lock files an older version left (1755, 0644, owned by user A): user B
    is told what to do instead of failing at its first trial; A's next run opens the folder,
    and B then takes A's old lock file read-only (flock works on it)."""
    lease_dir = shared_tmp / "leases"
    lease_dir.mkdir(mode=0o755)
    (lease_dir / "GPU-t.0.lock").write_text("")
    (lease_dir / "GPU-t.0.lock").chmod(0o644)
    for path in (lease_dir, lease_dir / "GPU-t.0.lock"):
        os.chown(path, USER_A, USER_A)

    refused = _second(lease_dir)["check"]
    assert isinstance(refused, list)
    assert "not writable by this user" in refused[0] and f"chmod 1777 {lease_dir}" in refused[1]

    first = _as_user(USER_A, lease_dir, _FIRST, stdin=subprocess.PIPE)
    try:
        assert first.stdout is not None
        first.stdout.readline()
        assert stat.S_IMODE(lease_dir.stat().st_mode) == 0o1777
        second = _second(lease_dir)
    finally:
        first.communicate(input="", timeout=60)
    # slot 0 is A's 0644 file: B holds it read-only, so no note of B's is written there
    assert second == {"slot0": True, "slot1": False, "slot2": True, "waited_longer": False,
                      "holders": {"0": [USER_B, None], "1": [USER_A, "a"],
                                  "2": [USER_B, None]}}


# User B, hostile: makes the shared folder before anyone (so its links are its own, which gets
# past fs.protected_symlinks), plants a link to a root-only file, one to /dev/zero, a FIFO, a
# second link to a file of its own, and holds an own 1 TiB (sparse) lease file whose note
# claims another process; then holds it until the test closes stdin.
_PLANT = """
os.umask(0)
lease_dir.mkdir(mode=0o1777)
os.symlink(sys.argv[4], lease_dir / "GPU-t.0.lock")
os.symlink("/dev/zero", lease_dir / "GPU-t.1.lock")
os.mkfifo(lease_dir / "GPU-t.2.lock", 0o666)
(lease_dir / "mine").write_text("")
os.link(lease_dir / "mine", lease_dir / "GPU-t.3.lock")
with open(lease_dir / "GPU-t.4.lock", "wb") as big:
    big.write(json.dumps({"study": "forged", "pid": 1}).encode())
    big.truncate(1 << 40)
(lease_dir / "GPU-t.4.lock").chmod(0o644)
import fcntl
held = os.open(lease_dir / "GPU-t.4.lock", os.O_RDONLY)
fcntl.flock(held, fcntl.LOCK_EX)
print(json.dumps({"held": True}), flush=True)
sys.stdin.read()
"""

# Run as root, in a process of its own (a read without bound would not come back): what a
# root orchestrator and `gpus` make of B's folder.
_AS_ROOT = """
import json, sys
from pathlib import Path
from hpo_orchestrator.placement import LeaseDir
leases = LeaseDir(Path(sys.argv[1]))
leases.check()
taken = {k: leases.try_acquire("GPU-t", k) for k in range(6)}
out = {"taken": [k for k, lease in taken.items() if lease is not None]}
for lease in taken.values():  # as the orchestrator does with each lease it takes
    if lease is not None:
        lease.describe(study="root", trial=0)
out["holders"] = {str(k): v for k, v in leases.holders("GPU-t").items()}
print(json.dumps(out))
"""


def test_what_another_user_planted_in_the_folder_is_never_followed_or_read(
        shared_tmp: Path) -> None:
    """A root run takes only a slot whose name holds a plain file of one link: a link (to a
    root-only file, to /dev/zero), a FIFO or a hard link planted by B is never opened through,
    written or read; B's huge lease file is read at most READ_CAP bytes; each is reported with
    the uid the kernel gives, B's forged note left out."""
    import json

    secret = shared_tmp / "root-only"
    secret.write_text("secret")
    secret.chmod(0o600)
    lease_dir = shared_tmp / "leases"
    hostile = subprocess.Popen(
        [sys.executable, "-c", _AS_USER, str(USER_B), str(lease_dir), _PLANT, str(secret)],
        env=cli_env(), text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    try:
        assert hostile.stdout is not None
        assert json.loads(hostile.stdout.readline()) == {"held": True}, hostile.stderr
        done = subprocess.run([sys.executable, "-c", _AS_ROOT, str(lease_dir)], env=cli_env(),
                              capture_output=True, text=True, timeout=120)
    finally:
        hostile.communicate(input="", timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert secret.read_text() == "secret"
    assert out["taken"] == [5]
    holders = out["holders"]
    assert {k: (h.get("blocked"), h["file_uid"]) for k, h in holders.items() if k < "4"} == {
        "0": ("a symbolic link", USER_B), "1": ("a symbolic link", USER_B),
        "2": ("not a plain file", USER_B), "3": ("a file with 2 links", USER_B)}
    assert holders["4"] == {"pid": hostile.pid, "uid": USER_B, "file_uid": USER_B}
    assert holders["5"]["uid"] == 0 and holders["5"]["study"] == "root"


# User B holds slot 0 of a GPU in a process that exits while a child it passed the descriptor
# to lives on (the lock stays, its pid is gone); user A holds slot 1 in a file of the mode an
# older version made (0666), where B then writes a note naming A's own pid.
_PASS_ON = """
import fcntl
fd = os.open(lease_dir / "GPU-t.0.lock", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, json.dumps({"study": "gone", "pid": os.getpid()}).encode())
fcntl.flock(fd, fcntl.LOCK_EX)
if os.fork() == 0:  # the child keeps the descriptor, and the lock, until stdin closes
    os.close(1), os.close(2)
    sys.stdin.read()
    os._exit(0)
out["pid"] = os.getpid()
"""


def test_a_holder_is_named_as_the_kernel_says_not_as_its_file_claims(shared_tmp: Path) -> None:
    import json

    lease_dir = shared_tmp / "leases"
    lease_dir.mkdir(mode=0o1777)
    lease_dir.chmod(0o1777)
    passer = _as_user(USER_B, lease_dir, _PASS_ON, stdin=subprocess.PIPE)
    assert passer.stdout is not None and passer.stdin is not None
    gone = json.loads(passer.stdout.readline())["pid"]
    assert passer.wait(timeout=60) == 0  # it exited; its child keeps the lock
    old = lease_dir / "GPU-t.1.lock"
    old.write_text("")
    os.chown(old, USER_A, USER_A)
    old.chmod(0o666)
    holder = _as_user(USER_A, lease_dir, """
import fcntl
fd = os.open(lease_dir / "GPU-t.1.lock", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print(json.dumps({"held": True}), flush=True)
sys.stdin.read()
""", stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        old.write_text(json.dumps({"study": "forged", "pid": holder.pid}))  # "B"'s note
        from hpo_orchestrator.placement import LeaseDir
        from hpo_orchestrator.placement._leases import describe_holder

        held = LeaseDir(lease_dir).holders("GPU-t")
    finally:
        holder.communicate(input="", timeout=60)
        passer.stdin.close()
    assert held[0] == {"pid": gone, "uid": None, "file_uid": USER_B}
    assert "which has exited" in describe_holder(held[0])
    assert held[1] == {"pid": holder.pid, "uid": USER_A, "file_uid": USER_A}  # no "forged"
    assert describe_holder(held[1]) == f"uid {USER_A}, pid {holder.pid}"


# User A's run on the host's cores (placement/_cores.py): its presence held until stdin closes.
_ON_CORES = """
lease = leases.announce_cores(study="a", cpus=[0, 1], trials=2, threads=1, wanted=2)
out["held"] = True
print(json.dumps(out), flush=True)
sys.stdin.read()
"""

# User B's run on the same cores: who it sees there, and what it says.
_SEES_CORES = """
from hpo_orchestrator.placement import CoreShare
share = CoreShare(leases, {0, 1}, 2, 1, "b", "h1")
share.announce()
share.check()
out["users"] = [[u.uid, u.pid, u.study, u.cores] for u in share.users]
out["notes"] = share.take_notes()
share.close()
"""


def test_a_run_of_another_user_on_the_cores_is_named_with_the_kernels_uid(shared_tmp: Path) -> None:
    """B's run on the cores A's run uses names A's run by the uid and pid the kernel gives,
    and its study from A's own note (A's file, which only A may write)."""
    import json

    lease_dir = shared_tmp / "leases"
    first = _as_user(USER_A, lease_dir, _ON_CORES, stdin=subprocess.PIPE)
    try:
        assert first.stdout is not None
        assert json.loads(first.stdout.readline()) == {"held": True}
        second = _as_user(USER_B, lease_dir, _SEES_CORES)
        stdout, stderr = second.communicate(timeout=60)
    finally:
        first.communicate(input="", timeout=60)
    assert second.returncode == 0, stderr
    seen = json.loads(stdout)
    assert seen["users"] == [[USER_A, first.pid, "a", 2]]
    [note] = seen["notes"]
    assert note.startswith(f"another hpo-orchestrator run (pid {first.pid}, uid {USER_A}, study 'a')")
    assert not [p for p in lease_dir.iterdir() if p.name.startswith(f"cores.{second.pid}-")]


def test_a_folder_others_may_write_without_the_sticky_bit_is_refused(shared_tmp: Path) -> None:
    """B's folder of mode 0777: any user could remove or swap another's lease. And a link B
    made where the folder should be is not followed."""
    from hpo_orchestrator.errors import ConfigError
    from hpo_orchestrator.placement import LeaseDir

    loose = shared_tmp / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    os.chown(loose, USER_B, USER_B)
    with pytest.raises(ConfigError, match="without the sticky bit") as refused:
        LeaseDir(loose).check()
    assert refused.value.hint and f"chmod 1777 {loose}" in refused.value.hint
    shared = shared_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    os.chown(shared, USER_B, USER_B)
    LeaseDir(shared).check()  # the shared case: sticky, made by another user's run
    link = shared_tmp / "link"
    link.symlink_to(shared)
    os.chown(link, USER_B, USER_B, follow_symlinks=False)
    with pytest.raises(ConfigError, match=f"symbolic link of uid {USER_B}"):
        LeaseDir(link).check()


_HOLD = """
import fcntl
lease_dir.mkdir(mode=0o1777, exist_ok=True)
lease_dir.chmod(0o1777)
fd = os.open(lease_dir / sys.argv[4], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print(json.dumps({"held": True}), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_a_run_blocked_by_another_users_lease_says_who_holds_it(shared_tmp: Path) -> None:
    """B holds the only slot of the GPU: the run says it waits, naming B's uid and pid as the
    kernel gives them, `gpus` names them too, and the run goes on once B lets go."""
    import json
    import threading
    import time

    from hpo_orchestrator.gpu._fake import fake_uuid
    from tests.conftest import run_cli, start_cli

    lease_dir = shared_tmp / "leases"
    holder = subprocess.Popen(
        [sys.executable, "-c", _AS_USER, str(USER_B), str(lease_dir), _HOLD,
         f"{fake_uuid(0)}.0.lock"], env=cli_env(), text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert holder.stdout is not None
    assert json.loads(holder.stdout.readline()) == {"held": True}
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": "1"}
    run = start_cli(shared_tmp, "run", "objective=custom",
                    "objective.target=tests.objectives:quadratic", "study.n_trials=1",
                    f"scheduler.lease_dir={lease_dir}", "scheduler.trials_per_gpu=1",
                    "scheduler.parallel=1", env=env)
    lines: list[str] = []
    assert run.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(run.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None \
                and not any("waiting for a slot" in line for line in lines):
            time.sleep(0.2)
        said = [line for line in lines if "waiting for a slot" in line]
        assert said, "".join(lines)
        assert f"uid {USER_B}, pid {holder.pid}" in said[0], said[0]
        gpus = run_cli(shared_tmp, "gpus", "--json", "--lease-dir", str(lease_dir), env=env)
        slots = json.loads(gpus.stdout)["gpus"][0]["slots"]
        assert [(s["slot"], s["uid"], s["pid"]) for s in slots] == [(0, USER_B, holder.pid)]
    finally:
        holder.communicate(input="", timeout=60)
    assert run.wait(timeout=180) == 0, "".join(lines) + (run.stderr.read() if run.stderr else "")
    reader.join(timeout=10)
    assert any("1/1" in line or "complete" in line for line in lines), "".join(lines)
