"""Which stalled rank is wedged: alive and busy, not stopped and not waiting.

When a rank's heartbeat is past its timeout, the hang monitor looks at the processes of
the ranks on its host (each heartbeat carries its pid and host) over a short window:

- **stopped**: a thread of the process is in state T (SIGSTOP, a debugger): ``hang``;
- **busy**: a thread of the process was running or runnable (state R) in at least
  ``BUSY_SHARE`` of the looks over the window, while it made no progress: a thread holding
  the GIL in a loop, or a loop that never ends. A rank waiting for it in a collective
  sleeps (state S: gloo waits on a condition). Runnable, not CPU time: on a loaded
  machine a spinning thread may get a fifth of a core, but it stays in state R;
- **waiting**: neither.

A stopped or busy rank is the culprit; the others are waiting for it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from faults.proc_stat import STATE, STIME, UTIME, stat_fields

#: Share of the looks in which a silent rank must have a thread in state R to be busy.
BUSY_SHARE = 0.6
#: Seconds the stalled ranks are looked at over, and the looks taken.
WINDOW = 0.5
LOOKS = 10


def _fields(pid: int, thread: str | None = None) -> list[str] | None:
    try:
        return stat_fields(pid, thread)
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of every thread of ``pid``; None when it is gone."""
    fields = _fields(pid)
    if fields is None or fields[STATE] == "Z":
        return None
    return (int(fields[UTIME]) + int(fields[STIME])) / os.sysconf("SC_CLK_TCK")


def thread_states(pid: int) -> set[str]:
    """The states (R, S, D, T, ...) of the threads of ``pid``."""
    states: set[str] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return states
    for task in tasks:
        fields = _fields(pid, task.name)
        if fields is not None:
            states.add(fields[STATE])
    return states


def classify(beats: dict[int, dict[str, Any]], window: float = WINDOW) -> dict[int, dict[str, Any]]:
    """Per rank on this host: ``state`` (stopped, busy or waiting), ``running`` (the share
    of looks with a thread in state R) and ``cpu_share`` (of one core), over ``window``
    seconds."""
    host = socket.gethostname()
    pids = {r: int(b["pid"]) for r, b in beats.items() if b.get("host") == host and "pid" in b}
    before = {r: cpu_seconds(pid) for r, pid in pids.items()}
    seen: dict[int, list[set[str]]] = {r: [] for r in pids}
    started = time.monotonic()
    for _ in range(LOOKS):
        time.sleep(window / LOOKS)
        for rank, pid in pids.items():
            seen[rank].append(thread_states(pid))
    spent = time.monotonic() - started
    found: dict[int, dict[str, Any]] = {}
    for rank, pid in pids.items():
        after, first = cpu_seconds(pid), before[rank]
        if after is None or first is None:
            continue
        running = sum("R" in states for states in seen[rank]) / LOOKS
        state = "waiting"
        if any(states & {"T", "t"} for states in seen[rank]):
            state = "stopped"
        elif running >= BUSY_SHARE:
            state = "busy"
        found[rank] = {
            "state": state,
            "running": round(running, 2),
            "cpu_share": round((after - first) / spent, 3),
        }
    return found


def culprits(found: dict[int, dict[str, Any]]) -> list[int]:
    """The stopped or busy ranks: the ones the others wait for."""
    return sorted(r for r, f in found.items() if f["state"] in ("stopped", "busy"))
