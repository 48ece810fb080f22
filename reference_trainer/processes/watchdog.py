"""Hang detection: a heartbeat per rank, watched by a small monitor process beside it.

Each rank writes a heartbeat file after every step: the step, the wall time, and the
timeout it has learned from its own step times (``safety_factor`` times the slowest
recent step, between ``min_timeout`` and ``initial_timeout``; ``initial_timeout`` until a
few steps have been seen), in the spirit of NVIDIA's resiliency extension. A monitor
process per rank (`reference_trainer.processes.hang_monitor`) reads it. A rank that makes no
progress for longer than its timeout (stopped, deadlocked, or blocked in a collective on
a peer that is) is journaled as ``detected`` by ``hang_watchdog`` with ``rank_lost`` for
the rank that fell behind, and killed, so that torchrun tears the job down and restarts
it instead of waiting out the process group's timeout.

The monitor is a process, not a thread, because a stopped process stops all its threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from faults.process import STARTED_BY_ENV
from harness.run_layout import RunLayout

WARMUP_STEPS = 3


@dataclass(kw_only=True, slots=True)
class WatchdogConfig:
    """How hangs are detected, and the process group's own timeout."""

    enabled: bool = True
    """Run the heartbeat monitor beside every rank."""
    initial_timeout: float = 120.0
    """Seconds allowed before the first steps have taught a timeout (start-up, loading)."""
    safety_factor: float = 5.0
    """The learned timeout is this many times the slowest of the recent steps..."""
    min_timeout: float = 5.0
    """...but never below this many seconds."""
    window: int = 50
    """Recent steps the timeout is learned from."""
    poll: float = 0.25
    """Seconds between the monitor's looks at the heartbeat."""
    collective_timeout: float = 120.0
    """Seconds a collective may wait on a peer (torch's default, 30 minutes, when the
    watchdog is off)."""

    def __post_init__(self) -> None:
        for name in ("initial_timeout", "safety_factor", "min_timeout", "poll"):
            if getattr(self, name) <= 0:
                raise ValueError(f"stability.watchdog.{name} must be greater than 0")
        if self.min_timeout > self.initial_timeout:
            raise ValueError("stability.watchdog.min_timeout must not exceed initial_timeout")


class Heartbeat:
    """The rank side: learn the timeout from step times, write the heartbeat, own the monitor."""

    def __init__(
        self, config: WatchdogConfig, run_dir: Path, rank: int, restart: int, world_size: int
    ) -> None:
        self.config = config
        self.path = RunLayout(run_dir).heartbeat_file(rank)
        self.run_dir, self.rank, self.restart, self.world_size = run_dir, rank, restart, world_size
        self._intervals: deque[float] = deque(maxlen=config.window)
        self._last: float | None = None
        self._step = 0
        self._monitor: subprocess.Popen[bytes] | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def timeout(self) -> float:
        """The current hang timeout in seconds."""
        c = self.config
        if len(self._intervals) < WARMUP_STEPS:
            return c.initial_timeout
        return min(c.initial_timeout, max(c.min_timeout, c.safety_factor * max(self._intervals)))

    def beat(self, step: int) -> None:
        """Record progress: ``step`` is done."""
        now = time.monotonic()
        if self._last is not None:
            self._intervals.append(now - self._last)
        self._last = now
        self._step = step
        self._write(step, self.timeout)

    def _write(self, step: int, timeout: float) -> None:
        record = {
            "step": step,
            "wall": time.time(),
            # The monitor times the heartbeat's age by this clock: the monitor runs on this
            # host, and the wall clock can jump (a stepped clock, a virtual machine paused
            # and resumed: 21 s at once, seen here), which would kill a healthy rank.
            "mono": time.monotonic(),
            "timeout": timeout,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "restart": self.restart,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)  # the monitor never reads half a heartbeat

    @contextlib.contextmanager
    def slow(self) -> Iterator[None]:
        """Around a one-time slow operation inside a step (loading the embedding model,
        seconds long, at the first document that needs it): the monitor allows it
        ``initial_timeout``, and its duration is not learned as part of a step's."""
        self._write(self._step, self.config.initial_timeout)
        started = time.monotonic()
        try:
            yield
        finally:
            if self._last is not None:
                self._last += time.monotonic() - started
            self._write(self._step, self.timeout)

    def start(self, step: int) -> None:
        """Write the first heartbeat and start the monitor process."""
        self.beat(step)
        self._last = None  # start-up is not a step interval
        argv = [
            sys.executable, "-m", "reference_trainer.processes.hang_monitor",
            "--run-dir", str(self.run_dir), "--rank", str(self.rank),
            "--world-size", str(self.world_size), "--pid", str(os.getpid()),
            "--poll", repr(self.config.poll),
        ]  # fmt: skip
        self._monitor = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            # (Named should it ever outlive its job: harness/running/process_tree.py.)
            env={**os.environ, STARTED_BY_ENV: f"rank {self.rank}'s hang monitor"},
        )

    def stop(self) -> None:
        """Stop the monitor (the run ended on its own)."""
        if self._monitor is not None:
            self._monitor.terminate()
            try:
                self._monitor.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._monitor.kill()
            self._monitor = None
        self.path.unlink(missing_ok=True)
