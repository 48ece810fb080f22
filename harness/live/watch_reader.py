"""What `tightrope watch` reads of a running job, incrementally and without touching it.

The watcher must never slow the job, so it only reads: each journal file from the byte
offset it reached last time, whole lines only (a line still being written waits for the
next refresh); the microscope again only when a new chunk file appeared; the small
heartbeat files whole. It takes no lock and writes nothing into the run directory.

What it keeps is bounded by the job's shape, not its length: the last step event of each
rank, a window of recent losses and step times, the last event time of each rank, and the
few event kinds that `harness.records.status.job_status` needs (starts, ends, commands,
faults), so a refresh costs the same at step 10 and at step 100,000.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import stat
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.input_limits import read_json
from harness.errors import JournalError
from harness.records.events import (
    CommandAnswered,
    FaultInjected,
    LayerStatsObserved,
    RunEnd,
    RunStart,
    StepObserved,
)
from harness.records.journal import Event, Journal, decode_line
from harness.records.microscope_file import Microscope, read_microscope
from harness.records.status import JobStatus, job_status
from harness.run_layout import RunLayout
from harness.running import background

_FILE_PATTERN = re.compile(r"rank-(\d+)\.jsonl")
#: Recent losses kept for the sparkline, and step times for the median.
WINDOW = 60
#: Kinds `job_status` reads; every other kind is folded into the running state and dropped.
_STATUS_KINDS = frozenset(e.kind for e in (RunStart, RunEnd, FaultInjected, CommandAnswered))
#: Per-layer history kept from `layer_stats` events (the fallback without a microscope).
LAYER_HISTORY = 200
#: The largest heartbeat file read (a job writes a few dozen bytes).
MAX_HEARTBEAT_BYTES = 4096


class WatchError(JournalError):
    """The run directory cannot be watched (missing, or no journal in it)."""


@dataclass(slots=True)
class JournalTail:
    """One journal file read from where the last read stopped."""

    path: Path
    offset: int = 0
    torn: int = 0  # complete lines that could not be parsed (a writer killed mid-line)

    def read_new(self) -> list[Event]:
        """Events of the whole lines appended since the last call; offset moves past them."""
        try:
            # Not blocking, and checked as opened: a FIFO or a link to a device named like
            # a journal would stall or flood the watcher.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return []  # removed or unreadable right now: try again next refresh
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise WatchError(f"cannot watch {self.path}: the journal is not a regular file")
        with os.fdopen(fd, "rb") as f:
            if info.st_size < self.offset:
                self.offset = 0  # not the file read before (a new run in the folder)
            try:
                f.seek(self.offset)
                data = f.read(info.st_size - self.offset)  # as it is now; whole lines kept
            except OSError:
                return []
        end = data.rfind(b"\n")
        if end < 0:
            return []  # nothing new, or only the start of a line still being written
        events: list[Event] = []
        for lineno, raw in enumerate(data[:end].split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                events.append(decode_line(raw.decode("utf-8"), self.path, lineno))
            except (ValueError, UnicodeDecodeError):
                self.torn += 1
        self.offset += end + 1
        return events


@dataclass(slots=True)
class RankState:
    """What the journal says of one rank so far."""

    last_step: Event | None = None
    last_wall: float | None = None  # the wall time of its latest event of any kind
    started: float | None = None  # wall of its latest run_start
    ended: Event | None = None  # its latest run_end, when after `started`
    losses: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    step_walls: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def steps_per_second(self) -> float | None:
        """Steps per second over the recent window, from the step events' wall times."""
        walls = list(self.step_walls)
        if len(walls) < 2 or walls[-1] <= walls[0]:
            return None
        return (len(walls) - 1) / (walls[-1] - walls[0])

    def median_step_time(self) -> float | None:
        """Median seconds per step: the trainer's `step_time`, else between step events."""
        if self.step_times:
            return statistics.median(self.step_times)
        walls = list(self.step_walls)
        gaps = [b - a for a, b in itertools.pairwise(walls) if b >= a]
        return statistics.median(gaps) if gaps else None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One rank's heartbeat file (`RUN_DIR/heartbeats/rank-R.json`), as last written."""

    step: int
    wall: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one frame of the view shows, read at ``now``."""

    run_dir: Path
    now: float
    ranks: dict[int, RankState]
    status: JobStatus
    ended: bool
    background_alive: bool | None  # None: not a background job
    heartbeats: dict[int, Heartbeat]
    microscope: Microscope | None
    layer_history: dict[tuple[int, str], deque[float]]  # (rank, layer) -> grad norms
    layer_stats_step: dict[int, int]  # rank -> step of its latest layer_stats event
    torn: int


class WatchReader:
    """Reads a run directory a little more at each `refresh`."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        if not self.run_dir.is_dir():
            raise WatchError(f"cannot watch {self.run_dir}: no such directory")
        if not self.layout.journal.is_dir():
            raise WatchError(
                f"cannot watch {self.run_dir}: no journal ({self.layout.journal} does not "
                "exist; is this a run directory, and has the job started?)"
            )
        self.tails: dict[int, JournalTail] = {}
        self._find_files()
        if not self.tails:
            raise WatchError(
                f"cannot watch {self.run_dir}: no journal ({self.layout.journal} holds no "
                "rank-<R>.jsonl file yet)"
            )
        self.ranks: dict[int, RankState] = {}
        self._status_events: list[Event] = []
        self.layer_history: dict[tuple[int, str], deque[float]] = {}
        self.layer_stats_step: dict[int, int] = {}
        self.microscope: Microscope | None = None
        self._chunk_names: frozenset[str] = frozenset()
        self.microscope_due = 0.0  # monotonic time before which it is not read again

    def _find_files(self) -> None:
        try:
            entries = list(os.scandir(self.layout.journal))
        except OSError:
            return
        for entry in entries:
            m = _FILE_PATTERN.fullmatch(entry.name)
            if m and int(m.group(1)) not in self.tails:
                self.tails[int(m.group(1))] = JournalTail(Path(entry.path))

    def _fold(self, event: Event) -> None:
        state = self.ranks.setdefault(event.rank, RankState())
        state.last_wall = (
            event.wall if state.last_wall is None else max(state.last_wall, event.wall)
        )
        if event.is_(StepObserved):
            state.last_step = event
            loss = event.get("loss")
            state.losses.append((event.step, float(loss) if loss is not None else math.nan))
            state.step_walls.append(event.wall)
            if isinstance(event.get("step_time"), (int, float)):
                state.step_times.append(float(event["step_time"]))
        elif event.is_(LayerStatsObserved):
            self.layer_stats_step[event.rank] = event.step
            for name, signals in (event.get("layers") or {}).items():
                value = signals.get("grad_norm") if isinstance(signals, dict) else None
                key = (event.rank, str(name))
                history = self.layer_history.setdefault(key, deque(maxlen=LAYER_HISTORY))
                history.append(math.nan if value is None else float(value))  # null: not finite
        if event.is_(RunStart):
            state.started, state.ended = event.wall, None
        elif event.is_(RunEnd):
            state.ended = event
        if event.kind in _STATUS_KINDS:
            self._status_events.append(event)

    def _read_microscope(self) -> None:
        # Listing the chunk folders is cheap; the chunks themselves are read again only
        # when a new one appeared (a chunk is renamed into place whole, never rewritten).
        root = self.layout.microscope
        names: set[str] = set()
        if root.is_dir():
            for folder in root.glob("rank-*"):
                names.update(f"{folder.name}/{p.name}" for p in folder.glob("*.npz"))
        if not names or names == self._chunk_names:
            return
        # Reading is whole-run (the chunks merge across restarts), so a long run's re-read
        # costs more: keep it under a tenth of the watcher's time, whatever the chunk rate.
        if time.monotonic() < self.microscope_due:
            return
        started = time.monotonic()
        self._chunk_names = frozenset(names)
        self.microscope = read_microscope(self.run_dir)
        self.microscope_due = time.monotonic() + 9 * (time.monotonic() - started)

    def _heartbeats(self) -> dict[int, Heartbeat]:
        beats: dict[int, Heartbeat] = {}
        folder = self.layout.heartbeats
        if not folder.is_dir():
            return beats
        for path in folder.glob("rank-*.json"):
            try:
                rank = int(path.stem.removeprefix("rank-"))
                data: Any = read_json(path, "heartbeat", MAX_HEARTBEAT_BYTES)
                beats[rank] = Heartbeat(step=int(data["step"]), wall=float(data["wall"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # mid-replace or not ours: the next refresh reads it
        return beats

    def _background_alive(self) -> bool | None:
        try:
            record = background.read_record(self.layout.background)
        except background.BackgroundError:
            return None
        return None if record is None else bool(background.alive(record))

    def refresh(self) -> Snapshot:
        """Read what was appended since the last refresh; the state as it is now."""
        self._find_files()
        for rank in sorted(self.tails):
            for event in self.tails[rank].read_new():
                self._fold(event)
        self._read_microscope()
        alive = self._background_alive()
        started = [s for s in self.ranks.values() if s.started is not None]
        # Over when every rank that started has ended since, or the background job's
        # processes are all gone; a background job still alive may yet restart its ranks.
        ended_by_journal = bool(started) and all(
            s.ended is not None and s.ended.wall >= (s.started or 0.0) for s in started
        )
        ended = (alive is False) or (ended_by_journal and alive is not True)
        return Snapshot(
            run_dir=self.run_dir,
            now=time.time(),
            ranks=self.ranks,
            # Only its armed, fired and refused faults are used: the step and loss come
            # from `ranks`, which sees every step event (this journal holds none).
            status=job_status(Journal(sorted(self._status_events, key=lambda e: e.wall))),
            ended=ended,
            background_alive=alive,
            heartbeats=self._heartbeats(),
            microscope=self.microscope,
            layer_history=self.layer_history,
            layer_stats_step=self.layer_stats_step,
            torn=sum(t.torn for t in self.tails.values()),
        )
