"""What a run left, read by tightrope itself: the parameter fingerprints the agent took
after every step, the loads it (or the trainer) journaled, and the files on disk.

A journal is read from a byte offset: the resume appends to the crash run's journal, so
what lies past the offset the file had before the resume is the resume's.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
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
    #: (path, step) of every file or folder the agent saw saved whole (``file_saved``).
    saved: list[tuple[str, int]] = field(default_factory=list)

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
        elif kind == "file_saved" and isinstance(step, int) and isinstance(r.get("path"), str):
            seen.saved.append((str(r["path"]), step))
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


#: An event named alike in two runs (`FileEvent.ident`): (rank, key, occurrence).
Ident = tuple[int, tuple[str, str, str | None], int]


@dataclass(frozen=True, slots=True)
class SaveFile:
    """A file of a save as the fault-free run left it, and the event that put it there."""

    size: int
    #: The event that put it there (`FileEvent.ident`).
    ident: Ident


#: A checkpoint as a unit: its step and its files as the fault-free run left them.
Unit = tuple[int, dict[str, SaveFile]]


def _names_step(name: str, step: int) -> bool:
    return step in [int(w) for w in re.findall(r"\d+", name)]


def _unit_root(rel: str, step: int) -> str | None:
    """The file or folder of ``rel`` (itself or the nearest folder above it) whose name
    holds ``step`` (``epoch=0-step=2.ckpt``, ``checkpoint-2/``); None when none does."""
    parts = rel.split("/")
    for end in range(len(parts), 0, -1):
        if _names_step(parts[end - 1], step):
            return "/".join(parts[:end])
    return None


def save_contents(
    events: list[FileEvent], run_dir: Path, saved: Sequence[tuple[str, int]] = ()
) -> list[Unit]:
    """The checkpoints of the fault-free run, each with its files as the run left them:
    every save (all the files of the save after a step; a save whose files a later one
    replaced or removed keeps only the rest, and with none left can never be told
    complete), and every file or folder the agent saw saved whole at a step (``saved``:
    (path relative to the run dir, step)) whose name, or its folder's, holds that step,
    with every file of the run under it (Lightning's ``epoch=0-step=2.ckpt`` beside the
    ``last.ckpt`` of the same save; a Hugging Face ``checkpoint-2/``; a DCP ``step-2/``)."""
    on_disk: dict[str, tuple[int, SaveFile]] = {}
    for rel, e in save_files(events).items():
        path = run_dir / rel
        if path.is_file() and e.save_step is not None:
            on_disk[rel] = (e.save_step, SaveFile(path.stat().st_size, e.ident))
    by_save: dict[int, dict[str, SaveFile]] = {}
    for rel, (step, f) in on_disk.items():
        by_save.setdefault(step, {})[rel] = f
    units: list[Unit] = sorted(by_save.items())
    roots = {(root, step) for rel, step in saved if (root := _unit_root(rel, step)) is not None}
    for root, step in sorted(roots):
        files = {r: f for r, (_, f) in on_disk.items() if r == root or r.startswith(root + "/")}
        if files:
            units.append((step, files))
    return units


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def saved_whole(run_dir: Path, ranks: int) -> dict[str, str]:
    """Each file the crash run's agent saw saved whole (``file_saved``), relative to the run
    dir: the SHA-256 of the bytes it saved there last."""
    hashes: dict[str, str] = {}
    root = run_dir.resolve()
    for rank in range(ranks):
        for r in journal_records(run_dir, rank):
            where, sha = r.get("path"), r.get("sha256")
            if r.get("kind") == "file_saved" and isinstance(where, str) and isinstance(sha, str):
                try:
                    hashes[str(Path(where).resolve().relative_to(root))] = sha
                except ValueError:
                    continue
    return hashes


#: Ops that put a file in place whole: what they move was written before (a temporary file
#: renamed into place, as fsspec's transaction and every atomic save do).
_INSTALLS = ("rename", "replace")


def _whole(path: Path, f: SaveFile, saved: dict[str, str], rel: str) -> bool:
    """On disk whole once its event finished: put there by a rename, or at the size the
    fault-free run left, or holding the very bytes the crash run's agent saw saved there.
    (Sizes alone are not enough: a checkpoint may hold its own path, as Lightning's does, and
    its size then follows the run dir's name.)"""
    if not path.is_file():
        return False
    if f.ident[1][0] in _INSTALLS or _size(path) == f.size:
        return True
    if rel not in saved:
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == saved[rel]


def newest_complete(
    contents: list[Unit], run_dir: Path, finished: set[Ident], saved: dict[str, str] | None = None
) -> int | None:
    """The newest save complete at the kill: each of its files put in place by an event the
    crash run got past (``finished``: each such event's `FileEvent.ident`, matched by op,
    path and occurrence, not by number) and on disk: put there by a rename, or at the size
    the fault-free run left (sizes, not bytes: a save may hold a run id or a time), or with
    the bytes the crash run's agent saw saved there (``saved``: `saved_whole`). None when
    there is none."""
    hashes = saved or {}
    whole = [
        step
        for step, files in contents
        if files
        and all(
            f.ident in finished and _whole(run_dir / rel, f, hashes, rel)
            for rel, f in files.items()
        )
    ]
    return max(whole, default=None)
