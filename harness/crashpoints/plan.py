"""The crash points of a job: the file events its fault-free run made, each named by the
save it belongs to, and the points made of them (killed ``before`` each event; ``torn``
where the writer is observed), each rank in turn the one that dies; a sample of them spread
evenly when there are too many."""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.inside.crash_hook import event_key

MODES = ("before", "torn")


@dataclass(frozen=True, slots=True)
class FileEvent:
    """One file event of the fault-free run, as the hook logged it."""

    n: int
    op: str
    path: str
    tornable: bool
    wall: float
    to: str | None = None
    #: The step after which the save that made it ran (None: before the first step).
    save_step: int | None = None
    #: The rank that made it.
    rank: int = 0
    #: Its rank's how-many-th event with its `key` (a point names its event so).
    occurrence: int = 1

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What two runs of a deterministic job agree on (a temporary file named after its
        process, ``tokenizer.tmp27184``, matches whatever the pid)."""
        return event_key(self.op, self.path, self.to)

    @property
    def ident(self) -> tuple[int, tuple[str, str, str | None], int]:
        """(rank, key, occurrence): the same event in another run of the job, whatever the
        events of other files around it."""
        return (self.rank, self.key, self.occurrence)

    def describe(self) -> str:
        """``op path`` (``-> to`` for a rename)."""
        return f"{self.op} {self.path}" + (f" -> {self.to}" if self.to else "")

    def document(self) -> dict[str, Any]:
        """Its part of crashpoints.json."""
        out: dict[str, Any] = {"n": self.n, "op": self.op, "path": self.path}
        if self.to is not None:
            out["to"] = self.to
        out["occurrence"] = self.occurrence
        out["save_step"] = self.save_step
        out["tornable"] = self.tornable
        return out

    @classmethod
    def from_document(cls, data: dict[str, Any]) -> FileEvent:
        """Back from `document` (a cached point)."""
        return cls(
            n=int(data["n"]),
            op=str(data["op"]),
            path=str(data["path"]),
            tornable=bool(data.get("tornable", False)),
            wall=0.0,
            to=data.get("to"),
            save_step=data.get("save_step"),
            occurrence=int(data.get("occurrence", 1)),
        )


def read_events(log: Path, rank: int = 0) -> list[FileEvent]:
    """The events of ``rank``'s log (its last line may be torn by the kill)."""
    events: list[FileEvent] = []
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return events
    counts: dict[tuple[str, str, str | None], int] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or "n" not in record:
            continue
        event = FileEvent(
            n=int(record["n"]),
            op=str(record["op"]),
            path=str(record["path"]),
            tornable=bool(record["tornable"]),
            wall=float(record["wall"]),
            to=record.get("to"),
            rank=rank,
        )
        counts[event.key] = counts.get(event.key, 0) + 1
        events.append(replace(event, occurrence=counts[event.key]))
    return events


def killed_record(log: Path) -> dict[str, Any] | None:
    """The line the hook wrote as it killed the process, when it did."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "killed" in record:
            return record
    return None


#: Packages never imported ahead of a run: tightrope's own, and the tests'.
_NOT_PRELOADED = ("harness", "faults", "reference_trainer", "tests", "ckpt_chaos")


def imported_modules(log: Path) -> tuple[str, ...]:
    """The installed modules a recording run imported, in order (its log's last line),
    less tightrope's own; empty when it did not end normally."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ()
    for line in reversed(lines[-3:]):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("modules"), list):
            names = [str(n) for n in record["modules"]]
            return tuple(n for n in names if n.split(".")[0] not in _NOT_PRELOADED)
    return ()


def _numbers(event: FileEvent) -> list[int]:
    words = f"{event.path}/{event.to or ''}"
    return [int(w) for w in re.findall(r"\d+", words)]


def name_saves(events: list[FileEvent], steps: list[tuple[float, int]]) -> list[FileEvent]:
    """Each event named by the step its save followed (``steps``: the rank's (wall, step)
    in journal order). The step is read from the path where it names one the run had
    finished (``checkpoint-8/...``, ``step=8.ckpt``: the largest such number); an event
    whose path names none (``latest``) belongs to the save before it when no more than one
    step ended between them (a save that runs beside the next step); else the last step
    finished before it (None: before the first)."""
    walls = [w for w, _ in steps]
    named: list[FileEvent] = []
    for event in events:
        i = bisect.bisect_right(walls, event.wall)
        done = steps[i - 1][1] if i else None
        in_path = [n for n in _numbers(event) if done is not None and 1 <= n <= done]
        step = max(in_path) if in_path else done
        if not in_path and named and named[-1].save_step is not None:
            between = i - bisect.bisect_right(walls, named[-1].wall)
            if between <= 1:
                step = named[-1].save_step
        named.append(replace(event, save_step=step))
    return named


@dataclass(frozen=True, slots=True)
class Point:
    """One crash point: a rank dies at an event, before it or with its file torn."""

    index: int
    rank: int
    mode: str
    event: FileEvent

    @property
    def slug(self) -> str:
        """Its folder's name."""
        return f"{self.index:04d}-r{self.rank}-{self.mode}-{self.event.n}"

    def label(self, ranks: int) -> str:
        """How the progress and the tables name it."""
        who = f"rank {self.rank} " if ranks > 1 else ""
        return f"#{self.index} {who}{self.mode} {self.event.describe()}"


def all_points(events: dict[int, list[FileEvent]], ranks: int) -> list[Point]:
    """Every point, numbered: for each rank in turn, each event killed before it, then torn
    where its writer is observed."""
    points: list[Point] = []
    for rank in range(ranks):
        for event in events.get(rank, []):
            points.append(Point(len(points), rank, "before", event))
            if event.tornable:
                points.append(Point(len(points), rank, "torn", event))
    return points


def spread(points: list[Point], most: int) -> list[Point]:
    """At most ``most`` points spread evenly over the list (all of them when it is short)."""
    if most >= len(points):
        return list(points)
    stride = len(points) / most
    return [points[int(i * stride)] for i in range(most)]
