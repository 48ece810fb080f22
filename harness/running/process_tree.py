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
import subprocess
import time
from dataclasses import dataclass

from faults.proc_stat import PPID, STATE, stat_fields
from faults.process import STARTED_BY_ENV


def descendants(pid: int, *, zombies: bool = True) -> list[int]:
    """Every process below ``pid`` in the parent tree, as ``/proc`` shows it now; without
    the zombies (ended, not yet reaped by their parent) when ``zombies`` is False."""
    children: dict[int, list[int]] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(entry.name)
            state, ppid = fields[STATE], int(fields[PPID])
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
        if state == "Z" and not zombies:
            continue
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


def end_by_stdin(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    """End a helper that ends when its stdin closes (and kills what it started then):
    close it, wait ``grace`` seconds, then kill its tree."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()


#: The environment variable that marks every process of one launch.
MARK = "TIGHTROPE_LAUNCH"


@dataclass(frozen=True, slots=True)
class LeftProcess:
    """A process of a launch found alive after the launch ended (then killed)."""

    pid: int
    #: Its command line, shortened (a ``python -c`` program by its first line).
    command: str
    #: What started it, as it says in its environment (`STARTED_BY_ENV`); "" when silent.
    started_by: str = ""

    def describe(self) -> str:
        """``pid N (COMMAND), started by WHAT``: one line for a check's detail."""
        who = f", started by {self.started_by}" if self.started_by else ""
        return f"pid {self.pid} ({self.command}){who}"


def marked(mark: str, name: str = MARK) -> list[int]:
    """Processes whose environment carries ``MARK=mark`` (inherited by everything a launch
    started, in whatever session or parent it ended up); ``name``: another variable."""
    return sorted(_marked(mark, name))


def _marked(mark: str, name: str = MARK) -> dict[int, list[bytes]]:
    """The marked processes with their environments."""
    needle = f"{name}={mark}".encode()
    found = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(os.path.join(entry.path, "environ"), "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue  # it exited while we looked, or is not ours to read
        if needle in environ:
            found[int(entry.name)] = environ
    return found


def _left(pid: int, environ: list[bytes]) -> LeftProcess:
    prefix = f"{STARTED_BY_ENV}=".encode()
    started_by = next(
        (e[len(prefix) :].decode(errors="replace") for e in environ if e.startswith(prefix)), ""
    )
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    if "-c" in argv[:-1]:  # an inline program: its first line says what it is
        at = argv.index("-c") + 1
        first = next((line for line in argv[at].splitlines() if line.strip()), "")
        argv[at] = repr(first.strip())
    command = " ".join(argv) or "?"
    return LeftProcess(pid, command if len(command) <= 160 else command[:157] + "...", started_by)


def kill_marked(mark: str, grace: float = 0.0, name: str = MARK) -> list[LeftProcess]:
    """SIGKILL every process left over from the launch ``mark`` (stopped ones too: SIGKILL
    ends a stopped process) once ``grace`` seconds have given them the chance to end on
    their own (a process already killed and still dying, a monitor that follows its rank
    out); what was killed, each named. ``name``: the variable, when not ``MARK``."""
    left = _marked(mark, name)
    if not left:  # a process caught in the middle of an exec can read as no environment
        time.sleep(0.05)
        left = _marked(mark, name)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _marked(mark, name)
    named = [_left(pid, environ) for pid, environ in sorted(left.items())]
    for pid in left:
        _signal(pid, signal.SIGKILL)
    return named
