"""What a run left, read by tightrope itself: the parameter fingerprints the agent took
after every step, the loads it (or the trainer) journaled, and the files on disk.

A journal is read from a byte offset: the resume appends to the crash run's journal, so
what lies past the offset the file had before the resume is the resume's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.crashpoints.plan import FileEvent
from harness.run_layout import RunLayout

#: Journal kinds that say which file a process loaded.
LOAD_KINDS = ("file_loaded", "file_load_failed", "checkpoint_loaded")


def journal_records(
    run_dir: Path, rank: int, start: int = 0, end: int | None = None
) -> list[dict[str, Any]]:
    """The journal lines of ``rank`` between byte offsets ``start`` and ``end`` (a torn line
    is skipped)."""
    path = RunLayout(run_dir).journal_file(rank)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(max(0, end - start))
    except OSError:
        return []
    records = []
    for line in data.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def journal_sizes(run_dir: Path, ranks: int) -> list[int]:
    """Each rank's journal size now (where a later process's lines will start)."""
    sizes = []
    for rank in range(ranks):
        try:
            sizes.append(RunLayout(run_dir).journal_file(rank).stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes


@dataclass(slots=True)
class Trained:
    """The steps a process (or a run) trained, as the agent saw them."""

    #: step -> the fingerprint of the parameters after it (the last one taken at that step).
    prints: dict[int, str] = field(default_factory=dict)
    #: Steps in the order they were trained (a step redone appears again).
    order: list[int] = field(default_factory=list)
    #: (wall, step) of every step event, for naming saves.
    walls: list[tuple[float, int]] = field(default_factory=list)
    loads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> int | None:
        """The highest step trained."""
        return max(self.order) if self.order else None


def trained(records: list[dict[str, Any]]) -> Trained:
    """What ``records`` show trained and loaded."""
    seen = Trained()
    for r in records:
        kind, step = r.get("kind"), r.get("step")
        if kind == "step" and isinstance(step, int):
            seen.order.append(step)
            seen.walls.append((float(r.get("wall", 0.0)), step))
            fingerprint = r.get("params_fingerprint")
            if isinstance(fingerprint, str):
                seen.prints[step] = fingerprint
        elif kind in LOAD_KINDS:
            keep = ("path", "step", "intact", "saved_step", "error")
            seen.loads.append({"kind": kind, **{k: r[k] for k in keep if k in r}})
    return seen


def save_files(events: list[FileEvent]) -> dict[str, FileEvent]:
    """For each file the run left, the event of a save that last wrote it (a rename moves
    the bytes: a folder renamed into place carries its files, and the rename is then the
    event that put them there)."""
    last: dict[str, FileEvent] = {}
    for e in events:
        if e.save_step is None:
            continue
        if e.op in ("open", "torch.save", "safetensors.save_file"):
            last[e.path] = e
        elif e.op == "copyfile" and e.to is not None:
            last[e.to] = e
        elif e.op in ("rename", "replace") and e.to is not None:
            moved = [p for p in last if p == e.path or p.startswith(e.path + "/")]
            for p in moved:
                del last[p]
                last[e.to + p[len(e.path) :]] = e
            if not moved:
                last[e.to] = e
        elif e.op in ("remove", "rmtree", "rmdir"):
            for p in [p for p in last if p == e.path or p.startswith(e.path + "/")]:
                del last[p]
    return last


@dataclass(frozen=True, slots=True)
class SaveFile:
    """A file of a save as the fault-free run left it, and the event that put it there."""

    size: int
    rank: int
    n: int


def save_contents(events: list[FileEvent], run_dir: Path) -> dict[int, dict[str, SaveFile]]:
    """Each save's files as the fault-free run left them: save step -> {path: file}. A
    save whose files a later one replaced or removed keeps only the rest (none: it can
    never be told complete)."""
    contents: dict[int, dict[str, SaveFile]] = {}
    for rel, e in save_files(events).items():
        path = run_dir / rel
        if path.is_file() and e.save_step is not None:
            contents.setdefault(e.save_step, {})[rel] = SaveFile(path.stat().st_size, e.rank, e.n)
    return contents


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def newest_complete(
    contents: dict[int, dict[str, SaveFile]], run_dir: Path, happened: dict[int, int]
) -> int | None:
    """The newest save complete at the kill: each of its files put in place by an event the
    crash run got past (``happened``: rank -> the first event number it did not finish)
    and on disk at the size the fault-free run left (sizes, not bytes: a save may hold a
    run id or a time). None when there is none."""
    whole = [
        step
        for step, files in contents.items()
        if files
        and all(
            f.n < happened.get(f.rank, 0) and _size(run_dir / rel) == f.size
            for rel, f in files.items()
        )
    ]
    return max(whole, default=None)
