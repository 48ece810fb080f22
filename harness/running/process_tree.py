"""Kill a command and everything it started, including children that left its process group.

A kill of a command's process group is not enough: torchrun starts every worker in a
session of its own, so SIGKILL to torchrun's group leaves the workers training as orphans.
The tree is found through the parent links in ``/proc`` (Linux); elsewhere only the group
is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the parent tree, as ``/proc`` shows it now."""
    children: dict[int, list[int]] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as f:
                stat = f.read()
            # The command name may hold spaces and parentheses: fields follow the last ")".
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _signal(pid: int, signum: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def kill_tree(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` and every descendant of ``pid``.

    The tree is frozen first (SIGSTOP, until a scan finds nothing new) so that nothing in
    it can start a process, or restart a worker, between the scan and the kill. ``pid``
    must not have been reaped yet, so that its number still names it.
    """
    _signal(pid, signal.SIGSTOP, group=True)
    _signal(pid, signal.SIGSTOP)
    frozen: set[int] = set()
    while fresh := [p for p in descendants(pid) if p not in frozen]:
        for child in fresh:
            _signal(child, signal.SIGSTOP)
        frozen.update(fresh)
    _signal(pid, signal.SIGKILL, group=True)
    _signal(pid, signal.SIGKILL)
    for child in frozen:
        _signal(child, signal.SIGKILL)


#: The environment variable that marks every process of one launch.
MARK = "TIGHTROPE_LAUNCH"


def marked(mark: str) -> list[int]:
    """Processes whose environment carries ``MARK=mark`` (inherited by everything a launch
    started, in whatever session or parent it ended up)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(os.path.join(entry.path, "environ"), "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            continue  # it exited while we looked, or is not ours to read
    return found


def kill_marked(mark: str, grace: float = 0.0) -> int:
    """SIGKILL every process left over from the launch ``mark`` (stopped ones too: SIGKILL
    ends a stopped process) once ``grace`` seconds have given them the chance to end on
    their own (a process already killed and still dying, a monitor that follows its rank
    out); the number killed."""
    left = marked(mark)
    if not left:  # a process caught in the middle of an exec can read as no environment
        time.sleep(0.05)
        left = marked(mark)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = marked(mark)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    return len(left)
