"""A command started in the background by one call and stopped by a later one.

A Chaos Toolkit experiment starts a job in one activity and stops it in another (or in a
later ``chaos run`` altogether), so nothing about the process may live in memory between
calls. The record is a file (``background.json``): the leader's pid, the command and a
launch mark that every process of the job inherits in its environment
(`harness.running.process_tree.MARK`). Stopping goes by the mark, so a pid reused by an
unrelated process since is never signalled, and workers that left the leader's process
group (torchrun's) are found all the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import TightropeError
from harness.running.process_tree import MARK, kill_marked, kill_tree, marked


class BackgroundError(TightropeError):
    """A background job could not be started, or its record is unreadable."""


@dataclass(frozen=True, slots=True)
class Record:
    """What ``background.json`` holds about one job started in the background."""

    pid: int
    mark: str
    argv: list[str]
    log: str
    started: float


@dataclass(frozen=True, slots=True)
class Stopped:
    """How a stop went: whether anything was running, and how it ended."""

    #: False when the record named no living process (already ended, or never started).
    was_running: bool
    #: Every process of it ended by itself within the grace period after SIGTERM.
    ended_gracefully: bool
    #: Processes still alive after the grace period, then killed with SIGKILL.
    killed: int


def read_record(path: Path) -> Record | None:
    """The record at ``path``; None when there is none."""
    try:
        data = json.loads(path.read_text())
        return Record(
            pid=int(data["pid"]),
            mark=str(data["mark"]),
            argv=[str(a) for a in data["argv"]],
            log=str(data["log"]),
            started=float(data["started"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackgroundError(f"{path} is not a background record: {exc}") from None


def alive(record: Record) -> list[int]:
    """Processes of the job that are alive now (zombies not counted)."""
    return marked(record.mark)


def start(
    argv: Sequence[str],
    *,
    record_path: Path,
    log: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
) -> Record:
    """Start ``argv`` in a session of its own, output appended to ``log``; record it.

    Refused while the record names a job that is still alive: one folder, one job."""
    previous = read_record(record_path)
    if previous is not None and alive(previous):
        raise BackgroundError(
            f"{record_path.parent} already has a job running (pid {previous.pid}); stop it first"
        )
    mark = uuid.uuid4().hex
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**env, MARK: mark},
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise BackgroundError(f"cannot start {argv[0]!r}: {exc.strerror}") from exc
    # Until the child has exec'd, its environment is still ours, without the mark: wait for
    # it, so a stop right after the start cannot miss the job.
    deadline = time.monotonic() + 5.0
    while proc.poll() is None and proc.pid not in marked(mark) and time.monotonic() < deadline:
        time.sleep(0.01)
    record = Record(proc.pid, mark, list(argv), str(log), time.time())
    record_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = record_path.with_name(f".{record_path.name}.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=1) + "\n")
    os.replace(tmp, record_path)
    return record


def exit_code(record: Record, wait: float = 0.0) -> int | None:
    """The leader's exit code when this process started it and it has ended; else None.
    ``wait``: seconds to give a leader that is still exiting (its process no longer counts
    as alive, and is not yet a zombie to reap).

    Reaps it, so a job that ended on its own leaves no zombie in a long ``chaos run``."""
    deadline = time.monotonic() + wait
    while True:
        try:
            pid, status = os.waitpid(record.pid, os.WNOHANG)
        except ChildProcessError:  # started by another process, or reaped already
            return None
        if pid == record.pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def stop(record: Record, grace: float = 10.0) -> Stopped:
    """SIGTERM every process of the job (a preemption, which the trainer answers by saving
    and exiting); SIGKILL whatever of it is left after ``grace`` seconds."""
    exit_code(record)
    if not alive(record):
        return Stopped(was_running=False, ended_gracefully=False, killed=0)
    # Every process of the job, not only the leader's group: torchrun's workers sit in
    # sessions of their own, and a leader that does not pass SIGTERM on must not leave
    # them to the SIGKILL below.
    for pid in alive(record):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        exit_code(record)
        if not alive(record):
            return Stopped(was_running=True, ended_gracefully=True, killed=0)
        time.sleep(0.1)
    left = alive(record)
    if record.pid in left:
        kill_tree(record.pid)
    killed = len(set(left))
    kill_marked(record.mark)
    for _ in range(50):  # reap the leader when it is ours, so no zombie stays behind
        exit_code(record)
        if not alive(record):
            break
        time.sleep(0.02)
    return Stopped(was_running=True, ended_gracefully=False, killed=killed)
