"""Was a damaged checkpoint ever loaded? Judged from the files, not from the trainer's word."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation
from harness.oracles.manifests import CheckpointState, inspect_checkpoint
from harness.oracles.verdict import Check, Evidence
from harness.records.events import CheckpointLoaded, CheckpointSaved, FileLoaded, FileLoadFailed
from harness.records.journal import Event
from harness.records.timeline import damaged_paths, faults, plural
from harness.run_layout import RunLayout

#: Corrupt loads named one by one in the detail; the rest are counted.
NAMED = 3


def _forms(path: Path) -> set[Path]:
    """The ways a path may have been written: as given (normalized) and resolved."""
    forms = {Path(os.path.normpath(path))}
    with contextlib.suppress(OSError, RuntimeError):
        forms.add(path.resolve())
    return forms


def _within(path: Path, directory: Path) -> bool:
    return any(p.is_relative_to(d) for p in _forms(path) for d in _forms(directory))


def locate(raw: str, run_dir: Path) -> Path:
    """The checkpoint directory a journal path names, on this machine."""
    path = Path(raw)
    candidates = [path] if path.is_absolute() else [path, run_dir / path]
    # The run directory may have moved since the run (copied off the machine it ran on).
    candidates.append(RunLayout(run_dir).checkpoints / path.name)
    return next((c for c in candidates if c.is_dir()), candidates[0])


@dataclass(frozen=True)
class _Load:
    """One `checkpoint_loaded` event and what its directory holds now."""

    event: Event
    state: CheckpointState
    roots: tuple[Path, ...]

    def names(self, paths: Iterable[Path]) -> set[str]:
        """Checkpoints of this load's chain that any of ``paths`` lies in."""
        return {
            name
            for name in self.state.chain
            for root in self.roots
            for path in paths
            if _within(path, root / name)
        }


@dataclass(frozen=True)
class NoCorruptCheckpointLoadedOracle(ExpectOracle):
    """Every checkpoint the run loaded verifies: the reference trainer's against its manifest
    (parents included), any file the agent saw loaded against the hash it had when saved."""

    name = "no_corrupt_checkpoint_loaded"
    expectation = Expectation(
        type=bool,
        order=7,
        passes_when="every checkpoint the run loaded verifies against its manifest (each "
        "file's size and SHA-256, the parent chain of a delta), checked by the harness "
        "itself, and no fault had damaged it before the load (a fault on another rank in the "
        "load's own step and attempt may have struck after the read: that load is "
        "unverifiable, not corrupt; where the agent's check at the load found every file as "
        "saved, the bytes decide: two ranks flipping the same bit of a shared file put it "
        "back); for a trainer written elsewhere, every file load the "
        "agent observed has the bytes of a save, and a load that raised (the framework "
        "refused the file) counts as a load of nothing corrupt",
        figure="corrupt loads",
    )

    def judge(self, evidence: Evidence) -> Check:
        """Count of loads of a checkpoint that was damaged before it was loaded."""
        journal = evidence.journal
        hits = [(f, damaged_paths(f)) for f in faults(journal)]
        saves = journal.of_kind(CheckpointSaved)
        states: dict[Path, CheckpointState] = {}
        corrupt: list[str] = []
        unverifiable = 0
        loads = journal.of_kind(CheckpointLoaded)
        for event in loads:
            raw = event.get("path")
            if not isinstance(raw, str) or not raw:
                unverifiable += 1
                continue
            where = locate(raw, evidence.run_dir)
            if where not in states:
                states[where] = inspect_checkpoint(where)
            load = _Load(event, states[where], (Path(raw).parent, where.parent))
            verdict, why = _judge_load(load, hits, saves)
            if verdict == "unverifiable":
                unverifiable += 1
            elif verdict == "corrupt":
                corrupt.append(f"{Path(raw).name} ({why})")
        # Loads the agent observed itself: the bytes loaded against the bytes saved.
        observed = journal.of_kind(FileLoaded)
        for event in observed:
            intact = event.get("intact")
            if intact is False:
                corrupt.append(
                    f"{Path(str(event.get('path'))).name} (its bytes differ from those saved "
                    f"at step {event.get('saved_step')})"
                )
            elif intact is not True:
                unverifiable += 1  # a file the run never saved: nothing to compare with
        # A load that raised put nothing in the model: a refusal, verified by the trainer's
        # own check (safetensors' header, the zip reader), and no corrupt load.
        refused = journal.of_kind(FileLoadFailed)
        loads = [*loads, *observed, *refused]
        expected = "0 corrupt loads"
        if not loads:
            return self.not_judged(
                "no checkpoint load was observed, so no load could be checked",
                unit="",
                expected=expected,
                loads=0,
                unverifiable=0,
            )
        if not corrupt and unverifiable == len(loads):
            # Nothing corrupt was found because nothing could be looked at.
            return self.not_judged(
                f"{plural(len(loads), 'load')}, none verifiable: each names no path, or its "
                "checkpoint is gone from disk, was damaged or saved again after the load, or "
                "was damaged on another rank while it loaded",
                unit="",
                expected=expected,
                loads=len(loads),
                unverifiable=unverifiable,
            )
        if corrupt:
            more = len(corrupt) - NAMED
            detail = f"loaded corrupt: {'; '.join(corrupt[:NAMED])}"
            detail += f"; and {more} more" if more > 0 else ""
        else:
            detail = f"{plural(len(loads), 'load')}, none of a corrupt checkpoint"
            if refused:
                detail += f" ({len(refused)} raised, so loaded nothing)"
            if unverifiable:
                detail += (
                    f" ({unverifiable} not verifiable: gone, or damaged after or while loaded)"
                )
        return self.verdict(
            not corrupt,
            len(corrupt),
            unit="",
            expected=expected,
            detail=detail,
            loads=len(loads),
            unverifiable=unverifiable,
        )


def _raced(fault: Event, load: Event) -> bool:
    """Whether a fault on another rank struck in the step and attempt of a load: the load
    event comes when the load has finished, so the damage may have landed after the bytes
    were read (the ranks of a rollback load together while rank 0's fault fires)."""
    return fault.rank != load.rank and (fault.step, fault.restart) == (load.step, load.restart)


def _judge_load(
    load: _Load, hits: list[tuple[Event, list[Path]]], saves: list[Event]
) -> tuple[Literal["intact", "corrupt", "unverifiable"], str]:
    """Whether one load was of a corrupt checkpoint, and why; unverifiable when the files
    are gone, or were damaged or saved again after the load, or damaged by a fault that
    raced it (nothing then shows whether the bytes it read were damaged).

    The bytes decide, not the fault's record: when the agent's check of the folder at the
    load found every file as saved, the load was intact even after a fault hit it (two
    ranks flipping the same bit of a shared file put it back)."""
    wall = load.event.wall

    def saved(name: str, after: float, before: float) -> bool:
        return any(
            after < s.wall < before and name in load.names([Path(str(s.get("path")))])
            for s in saves
        )

    hit = raced = ""
    for fault, paths in hits:
        if fault.wall >= wall:
            continue
        for name in sorted(load.names(paths)):
            # A checkpoint saved again under the same name after the damage is a new one.
            if saved(name, fault.wall, wall):
                continue
            why = f"{fault.get('fault', 'a fault')} hit {name} at step {fault.step}"
            if not _raced(fault, load.event):
                hit = hit or why
            elif not raced:
                raced = f"{why} on rank {fault.rank} while rank {load.event.rank} loaded it"
    # The agent checked the folder when it was loaded: that outlives the folder itself.
    recorded = load.event.get("verified")
    if recorded == "intact":
        return "intact", ""
    if hit:
        return "corrupt", hit
    if raced:
        # The agent's check, made after the read, saw the damage, not the bytes read.
        return "unverifiable", raced
    if recorded == "corrupt":
        return "corrupt", str(load.event.get("verified_reason", "corrupt when loaded"))
    state = load.state
    if state.status != "corrupt":
        return ("intact", "") if state.status == "intact" else ("unverifiable", state.reason)
    touched_later = any(fault.wall >= wall and load.names(paths) for fault, paths in hits) or any(
        saved(name, wall, math.inf) for name in state.chain
    )
    return ("unverifiable", state.reason) if touched_later else ("corrupt", state.reason)
