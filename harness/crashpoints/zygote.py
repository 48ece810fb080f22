"""The driver's side of the zygote (`harness.inside.zygote`): runs of a Python job forked
from one interpreter that imported torch once, instead of each starting Python and
importing torch anew.

Only a run the zygote can make exactly as a fresh start would goes through it: the command
is ``PYTHON SCRIPT.py ARGS`` or ``PYTHON -m MODULE ARGS`` (no interpreter option), with the
zygote's interpreter, and its environment is the zygote's but for the variables named in
`PER_RUN`; anything else (torchrun, a shell script, another environment) is launched as
usual. A run is watched as `harness.running.launch.run_process` watches one: output
appended to its log, its session killed at its deadline or when stopped, whatever it
left behind killed after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from queue import Empty, Queue
from typing import IO, Any

from harness.errors import TightropeError
from harness.running.launch import Launch
from harness.running.process_tree import MARK, end_by_stdin, kill_marked, kill_tree
from harness.running.warm_start import from_bare_server

#: Variables that differ from run to run (the run dir, the crash hook's point, the launch's
#: mark): a request's environment may differ from the zygote's in these only.
PER_RUN = (
    "TIGHTROPE_RUN_DIR",
    "TIGHTROPE_PLAN",
    "TIGHTROPE_CRASH_LOG",
    "TIGHTROPE_CRASH_WATCH",
    "TIGHTROPE_CRASH_AT",
    "TIGHTROPE_CRASH_IGNORE",
    "TIGHTROPE_CRASH_RANKS",
    MARK,
)

_SERVE = "import sys; path = list(sys.path); sys.path.append({root!r}); "
_SERVE += "from harness.inside.zygote import serve; serve(path, {preload!r})"


class ZygoteGone(TightropeError):
    """The zygote ended while a run forked from it was under way (see its log)."""


def forkable(argv: Sequence[str], python: str) -> bool:
    """``argv`` is ``python SCRIPT.py ...`` or ``python -m MODULE ...`` with this python."""
    if len(argv) < 2 or argv[0] != python:
        return False
    if argv[1] == "-m":
        return len(argv) >= 3 and not argv[2].startswith("-")
    return argv[1].endswith(".py") and not argv[1].startswith("-")


def static(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the variables that differ from run to run."""
    return {k: v for k, v in env.items() if k not in PER_RUN}


class Zygote:
    """One zygote process, shared by the threads that run points (see the module)."""

    def __init__(
        self, python: str, env: Mapping[str, str], log: Path, preload: tuple[str, ...] = ()
    ) -> None:
        self.python = python
        self.env = static(env)
        root = str(Path(__file__).resolve().parents[2])
        serve = _SERVE.format(root=root, preload=preload)
        self._log: IO[bytes] = open(log, "ab")  # noqa: SIM115 (closed in close)
        self._proc = subprocess.Popen(
            from_bare_server([python, "-c", serve], self.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**self.env, MARK: uuid.uuid4().hex},
            start_new_session=True,
        )
        self._lock = threading.Lock()
        self._waiting: dict[str, Queue[dict[str, Any]]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                queue = self._waiting.get(str(record.get("id")))
            if queue is not None:
                queue.put(record)
        with self._lock:  # the zygote died: every run waiting on it ends
            for queue in self._waiting.values():
                queue.put({"gone": True})

    def serves(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """This run can be forked from this zygote (same interpreter, same environment)."""
        return forkable(argv, self.python) and static(env) == self.env and self.alive()

    def alive(self) -> bool:
        """The zygote is running."""
        return self._proc.poll() is None

    def run(
        self,
        argv: Sequence[str],
        *,
        log: Path,
        deadline: float,
        env: dict[str, str],
        on_poll: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Launch | None:
        """Run ``argv`` forked from the zygote, as `run_process` runs one; None when the
        zygote could not start it (then launch it as usual)."""
        started = time.monotonic()
        mark = uuid.uuid4().hex
        ident = uuid.uuid4().hex
        queue: Queue[dict[str, Any]] = Queue()
        with open(log, "ab") as out:
            out.write(f"$ {shlex.join(argv)}\n".encode())
        request = {"id": ident, "argv": list(argv), "env": {**env, MARK: mark}, "log": str(log)}
        request["cwd"] = os.getcwd()
        with self._lock:
            self._waiting[ident] = queue
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except (OSError, ValueError):
                del self._waiting[ident]
                return None
        try:
            first = queue.get(timeout=60)
        except Empty:
            first = {"gone": True}
        if "pid" not in first:
            with self._lock:
                self._waiting.pop(ident, None)
            return None
        pid = int(first["pid"])
        code, timed_out, interrupted = self._watch(queue, pid, deadline, on_poll, stop)
        with self._lock:
            self._waiting.pop(ident, None)
        left = kill_marked(mark, grace=1.0)
        return Launch(
            code,
            timed_out,
            time.monotonic() - started,
            interrupted,
            left_behind=len(left),
            left_processes=tuple(p.describe() for p in left),
            ended=time.time(),
        )

    @staticmethod
    def _watch(
        queue: Queue[dict[str, Any]],
        pid: int,
        deadline: float,
        on_poll: Callable[[], None] | None,
        stop: threading.Event | None,
    ) -> tuple[int | None, bool, bool]:
        """(exit code, timed out, interrupted) of the child ``pid``."""
        while True:
            try:
                record = queue.get(timeout=0.2)
            except Empty:
                if on_poll is not None:
                    on_poll()
                interrupted = stop is not None and stop.is_set()
                if interrupted or time.monotonic() >= deadline:
                    kill_tree(pid)
                    with contextlib.suppress(Empty):
                        queue.get(timeout=30)  # its exit, reaped by the zygote
                    return None, not interrupted, interrupted
                continue
            if "gone" in record:
                kill_tree(pid)
                raise ZygoteGone(f"the crash points' zygote ended while pid {pid} ran")
            return int(record["exit"]), False, False

    def close(self) -> None:
        """End the zygote (it kills any child still running)."""
        end_by_stdin(self._proc)
        self._log.close()
