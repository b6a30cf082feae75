"""Containment of the trials' process trees: no process a trial started outlives it.

An objective may start processes of its own (``subprocess.Popen``, DataLoader workers); some
leave their parent's session (``setsid``) or double-fork, and a reuse worker lives on after
its trial. Linux gives three tools, used together:

- the orchestrator and each worker are *child subreapers* (``PR_SET_CHILD_SUBREAPER``,
  worker/_reaping.py): a descendant whose parent exits is re-parented to its worker (to us
  once the worker is gone), not to init, so it stays in view;
- :class:`ProcessTrees` records every descendant of every worker (and every orphan that came
  to us, by the ``HPO_SLOT`` it inherited) with its slot, and kills what a trial left behind
  when the trial ends (reuse mode) or its worker retires; orphans that exit are reaped (by
  the worker they came to: the next Job names what its last trial's sweep killed). A reuse
  worker says at each trial's end whether it has any child process: with none, it has no
  descendant either, and the walk of every process on the host (2-7 ms) is skipped;
- a worker dies with the orchestrator (``PR_SET_PDEATHSIG``: SIGKILL, set in the child).

After a ``kill -9`` of the orchestrator its subreaper is gone: the workers die with it, their
own children go to init. So the recorded processes are also on disk (``processes-<pid>.json``
in the study's run folder, rewritten when they change), and the next run of the study kills
those of a dead orchestrator at its start (:func:`sweep_left_behind`, by pid and creation
time). Not contained: what a trial started less than a scan (1 s) before such a kill, and
processes started outside the tree (``systemd-run``, ``ssh``, a daemon asked to start one).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from hpo_orchestrator.worker import SLOT, become_subreaper, restore_subreaper

__all__ = ["ProcessTrees", "become_subreaper", "restore_subreaper", "sweep_left_behind"]

_SCAN_S = 1.0  # how often the trees are walked (also at a trial's end that left processes)


class ProcessTrees:
    """Every process seen under a worker or re-parented to us, with the slot it belongs to.

    Owned by the orchestrator's loop (single-threaded). Processes are held as
    ``psutil.Process``: a recorded pid that was reused by an unrelated process is never
    signalled (psutil checks the creation time).
    """

    def __init__(self, record_dir: Path | None = None) -> None:
        self._me = os.getpid()
        self._seen: dict[int, tuple[psutil.Process, int | None]] = {}  # pid -> (process, slot)
        self._last_scan = 0.0
        self._record_path = record_dir / f"processes-{self._me}.json" if record_dir else None
        self._recorded: set[int] = set()  # the pids on disk now

    def scan(self, workers: Mapping[int, int], force: bool = False) -> None:
        """Record the descendants of ``workers`` ({slot: worker pid}) and the orphans that
        came to us; reap recorded orphans that exited. At most every _SCAN_S unless ``force``."""
        now = time.monotonic()
        if not force and now - self._last_scan < _SCAN_S:
            return
        self._last_scan = now
        children = _children_table()
        worker_pids = set(workers.values())
        for slot, pid in workers.items():
            stack = list(children.get(pid, []))
            while stack:
                descendant = stack.pop()
                stack.extend(children.get(descendant, []))
                self._record(descendant, slot)
        for pid in children.get(self._me, []):
            if pid not in worker_pids and pid not in self._seen:
                origin = _slot_of(pid)
                if origin is not None:  # a trial's (run_study may run in a process with others)
                    self._record(pid, origin)
        self._reap()
        self._save()

    def sweep(self, slot: int, since_epoch: float | None = None,
              keep: frozenset[int] = frozenset()) -> list[int]:
        """Kill the slot's recorded processes (created at or after ``since_epoch``: a trial's
        own, in reuse mode), except ``keep``; returns the pids signalled."""
        killed = []
        since = None if since_epoch is None else _on_create_time_clock(since_epoch)
        for pid, (proc, owner) in list(self._seen.items()):
            if owner != slot or pid in keep:
                continue
            try:
                if since is not None and proc.create_time() < since:
                    continue
                proc.send_signal(signal.SIGKILL)
                killed.append(pid)
            except psutil.Error:
                self._seen.pop(pid, None)
        self._reap()
        return killed

    def sweep_all(self, keep: frozenset[int] = frozenset()) -> int:
        """Kill every recorded process (the run is over), then reap what came to us."""
        killed = 0
        for pid, (proc, _slot) in list(self._seen.items()):
            if pid in keep:
                continue
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
                killed += 1
        deadline = time.monotonic() + 2.0
        while self._reap() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._record_path is not None:
            self._record_path.unlink(missing_ok=True)
        return killed

    def _save(self) -> None:
        """The recorded processes on disk, for the next run after a ``kill -9`` of this one."""
        if self._record_path is None or set(self._seen) == self._recorded:
            return
        entries = []
        for pid, (proc, _slot) in self._seen.items():
            with contextlib.suppress(psutil.Error):
                entries.append([pid, proc.create_time()])
        me = psutil.Process(self._me)
        temporary = self._record_path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps({"host": socket.gethostname(), "processes": entries,
                                             "orchestrator": [self._me, me.create_time()]}))
            os.replace(temporary, self._record_path)
            self._recorded = set(self._seen)
        except OSError:  # a full disk, a run folder that went away: containment goes on
            temporary.unlink(missing_ok=True)  # the next try writes it anew; none is left

    def _record(self, pid: int, slot: int | None) -> None:
        if pid in self._seen:
            return
        with contextlib.suppress(psutil.Error):
            self._seen[pid] = (psutil.Process(pid), slot)

    def _reap(self) -> int:
        """Collect the exit status of recorded orphans (our children now) that exited, so
        they do not stay zombies; forget those gone. Returns how many are still alive."""
        alive = 0
        for pid, (proc, _slot) in list(self._seen.items()):
            try:
                parent, status = proc.ppid(), proc.status()
            except psutil.Error:
                self._seen.pop(pid, None)
                continue
            if status == psutil.STATUS_ZOMBIE:
                if parent == self._me:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                self._seen.pop(pid, None)
            else:
                alive += 1
        return alive


def sweep_left_behind(run_dir: Path) -> int:
    """Kill what the trials of a dead orchestrator of this study left running (its records in
    ``run_dir``; a live one's are left alone), with their descendants; returns how many."""
    killed = 0
    for path in run_dir.glob("processes-*.json"):
        try:
            record = json.loads(path.read_text())
            if record["host"] != socket.gethostname():
                continue  # a run folder shared between hosts: their pids are not ours
            owner, owner_created = record["orchestrator"]
            processes = [(int(pid), float(created)) for pid, created in record["processes"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours
        if _same_process(owner, owner_created) is not None:
            continue
        for pid, created in processes:
            proc = _same_process(pid, created)
            if proc is None:
                continue  # gone, or the pid now names another process
            with contextlib.suppress(psutil.Error):
                for target in [*proc.children(recursive=True), proc]:
                    with contextlib.suppress(psutil.Error):
                        target.kill()
                        killed += 1
        path.unlink(missing_ok=True)
    return killed


def _same_process(pid: int, created: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one created at ``created``."""
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - created) < 0.05 else None
    except psutil.Error:
        return None


def _on_create_time_clock(epoch: float) -> float:
    """``epoch`` (``time.time()``) as psutil's ``create_time()`` would state a process started
    then. On Linux that is /proc/stat's boot time, in whole seconds, plus the start in clock
    ticks: a process started just after ``epoch`` reads up to a second earlier than it, and a
    sweep since a trial's start spared what the trial started in its first second. Rounded
    down to a tick, so a process started within a tick (10 ms) before ``epoch`` counts too."""
    if not sys.platform.startswith("linux"):
        return epoch
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        since_boot = epoch - (time.time() - time.clock_gettime(time.CLOCK_BOOTTIME))
        return math.floor(since_boot * ticks) / ticks + psutil.boot_time()
    except (OSError, ValueError, AttributeError):
        return epoch


def _children_table() -> dict[int, list[int]]:
    """{ppid: [pid, ...]} of every process: on Linux straight from /proc/PID/stat (about 5 ms
    for a hundred processes; psutil.process_iter takes about 35), elsewhere through psutil."""
    table: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        entries = []
    if not entries:
        for proc in psutil.process_iter(["ppid"]):
            table.setdefault(proc.info["ppid"], []).append(proc.pid)
        return table
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
            ppid = int(stat.rpartition(b")")[2].split()[1])  # the name may hold ") "
        except (OSError, ValueError, IndexError):  # it exited meanwhile
            continue
        table.setdefault(ppid, []).append(int(entry))
    return table


def _slot_of(pid: int) -> int | None:
    """The slot an orphan came from: the HPO_SLOT its worker was born with (inherited)."""
    try:
        value = psutil.Process(pid).environ().get(SLOT)
    except psutil.Error:
        return None
    return int(value) if value and value.isdigit() else None
