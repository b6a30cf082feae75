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
out["holders"] = {str(k): v.get("study") for k, v in leases.holders("GPU-t").items()}
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
        assert stat.S_IMODE((lease_dir / "GPU-t.0.lock").stat().st_mode) == 0o666
        second = _second(lease_dir)
    finally:
        first.communicate(input="", timeout=60)
    # B's own leases are held too (slot 2 without a note); slot 0 carries B's note in A's file
    assert second == {"slot0": True, "slot1": False, "slot2": True, "waited_longer": False,
                      "holders": {"0": "b", "1": "a", "2": None}}


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
                      "holders": {"0": None, "1": "a", "2": None}}
