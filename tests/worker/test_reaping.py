"""Unit tests of worker/_reaping.py: what a child subreaper can tell about its descendants
(the whole-study tests are in tests/scheduler/test_reliability_children.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Run in a process of its own: becoming a subreaper must not change the test runner.
_SCENARIO = """
import os, signal, subprocess, time
from tests.misbehaving import double_fork
from hpo_orchestrator.worker._reaping import become_subreaper, collect, has_children

assert become_subreaper() is not None
assert not has_children(), "a fresh process has no child"

# a double fork whose middle is waited for: the grandchild is an orphan, and comes to us
orphan = double_fork("600")
assert has_children(), "the orphan is our child"
assert collect({orphan}) == {orphan}, "still running: to try again"

os.kill(orphan, signal.SIGKILL)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    with open(f"/proc/{orphan}/stat") as handle:
        if handle.read().rpartition(")")[2].split()[0] == "Z":
            break
    time.sleep(0.01)
assert has_children(), "an exited child not yet collected still counts"
assert collect({orphan}) == set() and not os.path.exists(f"/proc/{orphan}")
assert not has_children()

# a child of our own code that exited: its exit status stays for whoever waits for it
plain = subprocess.Popen(["sleep", "600"])
plain.kill()
time.sleep(0.2)
assert has_children()
assert plain.wait() == -signal.SIGKILL, plain.returncode
assert not has_children()
assert collect({plain.pid}) == set(), "not our child any more: dropped"
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_a_subreaper_sees_orphans_as_children_and_collects_only_what_it_is_told() -> None:
    done = subprocess.run([sys.executable, "-c", _SCENARIO], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
