"""A process's state as Linux reports it in ``/proc/PID/stat``: the one place that file is
parsed (its second field, the command name, may hold spaces and parentheses, so the fields
are those after the last ``)``). Index names follow proc(5) (``state`` is its field 3).

Used by the process faults, the harness's process tree, the reference trainer's hang
monitor and the tests.
"""

from __future__ import annotations

#: Indexes into `stat_fields`: R, S, D, Z (zombie), T (stopped) ...; the parent's pid;
#: user and system CPU time in clock ticks; the start time in ticks after boot.
STATE, PPID, UTIME, STIME, START_TIME = 0, 1, 11, 12, 19


def stat_fields(pid: int | str, thread: int | str | None = None) -> list[str]:
    """The fields of ``/proc/PID/stat`` (``thread``: of ``/proc/PID/task/THREAD/stat``)
    after the command name. Raises `OSError` as reading the file does
    (`FileNotFoundError`: no such process or thread, or no /proc)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def state(pid: int | str) -> str:
    """``pid``'s state letter (``Z``: a zombie, exited but not reaped). Raises as
    `stat_fields` does."""
    return stat_fields(pid)[STATE]
