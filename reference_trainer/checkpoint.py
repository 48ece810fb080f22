"""Full checkpoints written atomically and read with ``weights_only=True``.

On disk::

    RUN_DIR/checkpoints/step-00000040/state.pt       model, optimizer, scaler, step, data
    RUN_DIR/checkpoints/step-00000040/rng-rank-0.pt  every RNG state of rank 0 (one per rank)
    RUN_DIR/checkpoints/latest                       "step-00000040", written last

A save fills a hidden ``.step-N.tmp`` directory, fsyncs every file, renames it into
place, fsyncs the folder and only then replaces ``latest``, so a crash at any moment
leaves either the previous checkpoint as latest or the new one complete.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainer.errors import CheckpointError

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "state.pt"
_NAME = re.compile(r"step-(\d{8})")


def checkpoint_root(run_dir: Path) -> Path:
    """The folder holding a run's checkpoints."""
    return run_dir / CHECKPOINT_DIR


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint taken after ``step`` steps."""
    return f"step-{step:08d}"


def rng_file(rank: int) -> str:
    """File name of one rank's RNG states inside a checkpoint."""
    return f"rng-rank-{rank}.pt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_file(obj: Any, path: Path) -> None:
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


def save_checkpoint(
    run_dir: Path,
    step: int,
    state: dict[str, Any] | None,
    *,
    rank: int,
    barrier: Callable[[], None],
) -> Path:
    """Save one checkpoint; every rank calls this, rank 0 passes ``state`` and publishes.

    Every rank writes its RNG states; after a barrier, rank 0 writes the shared state,
    moves the complete directory into place and points ``latest`` at it.
    """
    root = checkpoint_root(run_dir)
    final = root / checkpoint_name(step)
    tmp = root / f".{final.name}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    _save_file(rng_state(), tmp / rng_file(rank))
    barrier()
    if rank == 0:
        if state is None:
            raise ValueError("rank 0 must pass the checkpoint state")
        _save_file(state, tmp / STATE_FILE)
        _fsync_dir(tmp)
        if final.exists():  # a step redone after a restart: the new save wins
            old = root / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            shutil.rmtree(old)
        tmp.rename(final)
        _fsync_dir(root)
        _write_latest(root, final.name)
    barrier()
    return final


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)
    _fsync_dir(root)


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (never the latest one)."""
    root = checkpoint_root(run_dir)
    latest = latest_checkpoint(run_dir)
    done = sorted(p for p in root.iterdir() if _NAME.fullmatch(p.name) and p.is_dir())
    removed = []
    for path in done[:-keep]:
        if path != latest:
            shutil.rmtree(path)
            removed.append(path)
    return removed


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` points at; None when the run has none."""
    pointer = checkpoint_root(run_dir) / LATEST
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {pointer}: {exc}") from exc
    if not _NAME.fullmatch(name):
        raise CheckpointError(f"{pointer} names {name!r}, which is not a checkpoint")
    path = pointer.parent / name
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {name}, but {path} does not exist")
    return path


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory was taken at, from its name."""
    match = _NAME.fullmatch(path.name)
    if not match:
        raise CheckpointError(f"{path} is not a checkpoint directory (expected step-NNNNNNNN)")
    return int(match.group(1))


def _load_file(path: Path) -> dict[str, Any]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is missing") from None
    except Exception as exc:  # torch raises many kinds for damaged files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint file {path} is unreadable: {reason}") from exc
    if not isinstance(obj, dict):
        raise CheckpointError(f"checkpoint file {path} holds {type(obj).__name__}, not a dict")
    return obj


def load_state(path: Path) -> dict[str, Any]:
    """The shared state of a checkpoint (model, optimizer, scaler, step, data position)."""
    state = _load_file(path / STATE_FILE)
    missing = {"step", "model", "optimizer", "scaler", "data"} - state.keys()
    if missing:
        raise CheckpointError(f"{path / STATE_FILE} lacks {', '.join(sorted(missing))}")
    return state


def load_rng(path: Path, rank: int) -> dict[str, Any] | None:
    """One rank's RNG states from a checkpoint; None when that rank did not exist then."""
    file = path / rng_file(rank)
    return _load_file(file) if file.exists() else None
