"""Finding checkpoints in a folder tree as the reference trainer lays it out (its names:
`faults.checkpoint_tree`), and writing into it as a damaged disk would: real writes, flushed
and fsynced, never outside the run. A save in progress is never a target.
"""

from __future__ import annotations

import os
from pathlib import Path

from faults.checkpoint_tree import LATEST, STEP_NAME
from faults.errors import InjectionError, NothingToDamage

DATA = "data"  # the default target: the data file, full or delta


def contained(path: Path, roots: list[Path], field: str) -> Path:
    """``path``, once every symlink in it is resolved, when it lies inside one of ``roots``;
    else an `InjectionError` naming the field that led there. Nothing outside the run (or
    the trainer's working directory) is ever touched."""
    real = path.resolve()
    if not any(real.is_relative_to(root.resolve()) for root in roots):
        shown = " or ".join(str(r) for r in roots)
        raise InjectionError(f"{field}: {path} resolves to {real}, outside {shown}; refused")
    return path


def step_of(path: Path) -> int:
    """The step a ``step-NNNNNNNN`` folder holds."""
    match = STEP_NAME.fullmatch(path.name)
    if match is None:
        raise InjectionError(f"{path} is not a checkpoint directory (expected step-NNNNNNNN)")
    return int(match.group(1))


def complete_checkpoints(root: Path) -> list[Path]:
    """The ``step-*`` folders under ``root``, oldest first."""
    return sorted(p for p in root.iterdir() if STEP_NAME.fullmatch(p.name) and p.is_dir())


def latest_checkpoint(root: Path) -> Path:
    """The folder ``latest`` names or, without that file, the newest checkpoint."""
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        path = root / name
        if not STEP_NAME.fullmatch(name) or not path.is_dir():
            raise InjectionError(f"{pointer} names {name!r}, but {path} is not a checkpoint")
        return path
    done = complete_checkpoints(root)
    if not done:
        raise NothingToDamage(f"no checkpoint in {root} (no {LATEST} file, no step-* folder)")
    return done[-1]


def previous_checkpoint(root: Path, latest: Path) -> Path:
    """The newest complete checkpoint older than ``latest``."""
    older = [p for p in complete_checkpoints(root) if step_of(p) < step_of(latest)]
    if not older:
        raise NothingToDamage(f"no checkpoint older than {latest.name} in {root}")
    return older[-1]


def resolve_checkpoint(root: Path, which: str) -> Path:
    """``latest``, ``previous`` or an explicit name, as an existing folder."""
    if which == "latest":
        return latest_checkpoint(root)
    if which == "previous":
        return previous_checkpoint(root, latest_checkpoint(root))
    path = root / which
    if not path.is_dir():
        raise NothingToDamage(f"checkpoint {path} does not exist")
    return path


def write_at(path: Path, offset: int, data: bytes, end: int | None = None) -> None:
    """Write ``data`` at ``offset`` (then cut the file at ``end``), flushed and fsynced."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        if end is not None:
            f.truncate(end)
        f.flush()
        os.fsync(f.fileno())


def fsync(path: Path) -> None:
    """fsync a file or folder by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_latest(root: Path, name: str) -> None:
    """Point ``latest`` at ``name`` atomically, as a real save would."""
    tmp = root / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)
    fsync(root)
