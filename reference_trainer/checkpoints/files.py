"""Checkpoint files: written atomically, read with ``weights_only=True``.

On disk::

    RUN_DIR/checkpoints/step-00000040/state.pt       model, optimizer, scaler, step, data
                                     /delta.bin      (instead, in a delta checkpoint)
    RUN_DIR/checkpoints/step-00000040/rng-rank-0.pt  every RNG state of rank 0 (one per rank)
    RUN_DIR/checkpoints/step-00000040/manifest.json  hashes of all the above, written last
    RUN_DIR/checkpoints/latest                       "step-00000040", written after that
    RUN_DIR/run-id                                   the run's id, bound into every manifest

``latest`` is a hint for people and tools: resume reads the directories themselves and
takes the newest one that proves to be this run's, intact (see `manifest`).
A save fills a hidden ``.step-N.tmp`` directory, fsyncs every file, renames it into
place, fsyncs the folder and only then replaces ``latest``, so a crash at any moment
leaves either the previous checkpoint as latest or the new one complete. This module
holds the file-level pieces; `reference_trainer.checkpoints.manager` decides what to save
and when, and verifies what it loads.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from faults.checkpoint_tree import LATEST as LATEST  # the tree's names, re-exported
from faults.checkpoint_tree import STATE_FILE as STATE_FILE
from faults.checkpoint_tree import STEP_NAME as _NAME
from faults.checkpoint_tree import TMP_NAME as _TMP
from faults.checkpoint_tree import checkpoint_name as checkpoint_name
from harness.run_layout import RunLayout
from reference_trainer.errors import CheckpointError

_RUN_ID = re.compile(r"[0-9a-f]{32}")


def rng_file(rank: int) -> str:
    """File name of one rank's RNG states inside a checkpoint."""
    return f"rng-rank-{rank}.pt"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_file(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` and fsync it."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    """Every RNG this process draws from, as plain tensors and ints (safe to load)."""
    np_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    torch.set_rng_state(state["torch"])
    npy = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def publish(tmp: Path, final: Path) -> None:
    """Move a fully written, fsynced checkpoint directory into place, then point
    ``latest`` at it. A step saved again after a rollback replaces the old directory."""
    root = final.parent
    fsync_dir(tmp)
    if final.exists():
        old = root / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    fsync_dir(root)
    write_latest(root, final.name)


def write_latest(root: Path, name: str) -> None:
    """Replace the ``latest`` pointer atomically (a directory in its place, which no save
    of ours writes, is removed first: a rename cannot replace one)."""
    pointer = root / LATEST
    if pointer.is_dir() and not pointer.is_symlink():
        shutil.rmtree(pointer)
    tmp = root / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Published checkpoint directories, oldest first: real directories named
    ``step-NNNNNNNN`` (hidden in-progress ones and symlinks excluded). Whether one is
    intact and this run's is for `reference_trainer.checkpoints.manifest` to say."""
    root = RunLayout(run_dir).checkpoints
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p for p in entries if _NAME.fullmatch(p.name) and _real_dir(p))


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def read_plain(path: Path, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of ``path``, or None when it is not a regular file. It
    never follows a symlink (that is an `OSError`) and never blocks on a FIFO; a missing
    file is `FileNotFoundError`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def latest_hint(run_dir: Path) -> str | None:
    """The name ``latest`` holds, when it is a small regular file naming a checkpoint;
    None otherwise (missing, empty, garbage, a symlink, a directory, a FIFO: none of them
    blocks or raises)."""
    try:
        raw = read_plain(RunLayout(run_dir).checkpoints / LATEST, 64)
    except OSError:
        return None
    if raw is None:
        return None
    try:
        name = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return name if _NAME.fullmatch(name) else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names when that is a real checkpoint directory, else the
    newest by name; None when the run has none. Trusted only without integrity checks."""
    name = latest_hint(run_dir)
    if name is not None and _real_dir(RunLayout(run_dir).checkpoints / name):
        return RunLayout(run_dir).checkpoints / name
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def remove_unfinished(run_dir: Path) -> list[Path]:
    """Delete the ``.step-N.tmp`` folders of saves that never finished (a crash or kill
    mid-save); rank 0 calls this before its first step, while no save is in flight."""
    root = RunLayout(run_dir).checkpoints
    try:
        stale = [p for p in root.iterdir() if _TMP.fullmatch(p.name) and _real_dir(p)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def new_run_id(run_dir: Path) -> str:
    """Give a fresh run its id (``RUN_DIR/run-id``), written atomically and fsynced."""
    run_id = uuid.uuid4().hex
    path = RunLayout(run_dir).run_id
    tmp = RunLayout.aside(path)
    with open(tmp, "w") as f:
        f.write(run_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(run_dir)
    return run_id


def read_run_id(run_dir: Path) -> str:
    """The run's id; a `CheckpointError` when the file is missing or not an id."""
    path = RunLayout(run_dir).run_id
    try:
        raw = read_plain(path, 64) or b""
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing: this run dir was not written by this version of the "
            "reference trainer, or the file was deleted"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc.strerror}") from exc
    run_id = raw.decode("ascii", errors="replace").strip()
    if not _RUN_ID.fullmatch(run_id):
        raise CheckpointError(f"{path} does not hold a run id (32 hex digits)")
    return run_id


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory was taken at, from its name."""
    match = _NAME.fullmatch(path.name)
    if not match:
        raise CheckpointError(f"{path} is not a checkpoint directory (expected step-NNNNNNNN)")
    return int(match.group(1))


def load_file(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of a dict, from the file's bytes read once; with
    ``sha256``, those very bytes must hash to it, so a file changed after the manifest
    check (another rank's disk fault in between) is refused, never loaded. A
    `CheckpointError` naming the file when it is missing, damaged or holds anything but
    plain data."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is missing") from None
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {path} is unreadable: {exc.strerror}") from exc
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(
            f"checkpoint file {path} does not match its hash in the manifest as it was read "
            "(changed after it was verified)"
        )
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for damaged files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint file {path} is unreadable: {reason}") from exc
    if not isinstance(obj, dict):
        raise CheckpointError(f"checkpoint file {path} holds {type(obj).__name__}, not a dict")
    return obj


def load_rng(path: Path, rank: int) -> dict[str, Any] | None:
    """One rank's RNG states from a checkpoint; None when that rank did not exist then."""
    file = path / rng_file(rank)
    return load_file(file) if file.exists() else None
