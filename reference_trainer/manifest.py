"""Checkpoint manifests: what a checkpoint must contain, hashed, so that a damaged one is
refused before its contents are trusted.

``manifest.json`` is the last file written into a checkpoint directory. It names every
file with its size and SHA-256, and every tensor of the restored state with its shape,
dtype and the SHA-256 of its raw bytes (so a delta, once decoded, is checked too), plus
the step, the kind (full or delta) and the parent checkpoint. It is plain JSON: reading
it never runs code.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from reference_trainer.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = 1
_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype and layout independent of strides)."""
    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def iter_tensors(state: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a nested state with its dotted path."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from iter_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from iter_tensors(value, f"{prefix}.{i}" if prefix else str(i))


def describe_tensors(state: Any) -> dict[str, dict[str, Any]]:
    """Shape, dtype and digest of every tensor of a state."""
    return {
        path: {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "sha256": tensor_digest(t),
        }
        for path, t in iter_tensors(state)
    }


def write_manifest(
    directory: Path, *, step: int, kind: str, parent: str | None, tensors: dict[str, Any]
) -> dict[str, Any]:
    """Hash every file in ``directory`` and write the manifest last, fsynced."""
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "format": FORMAT,
        "step": step,
        "kind": kind,
        "parent": parent,
        "files": files,
        "tensors": tensors,
    }
    path = directory / MANIFEST
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    return manifest


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a checkpoint; an error naming what is wrong when it is unusable."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing (the save never finished, or it was deleted)"
        ) from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a format-{FORMAT} manifest")
    for key in ("step", "kind", "files", "tensors"):
        if key not in manifest:
            raise CheckpointError(f"{path} lacks {key!r}")
    return manifest


def verify_files(directory: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest names exists with its size and hash."""
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(f"{path} has {size} bytes, the manifest says {expected['bytes']}")
        if file_digest(path) != expected["sha256"]:
            raise CheckpointError(f"{path} does not match its hash in the manifest")


def verify_tensors(directory: Path, manifest: dict[str, Any], state: Any) -> None:
    """The restored state holds exactly the manifest's tensors, bit for bit."""
    found = dict(iter_tensors(state))
    expected = manifest["tensors"]
    if found.keys() != expected.keys():
        missing = sorted(expected.keys() - found.keys())[:3]
        extra = sorted(found.keys() - expected.keys())[:3]
        raise CheckpointError(
            f"{directory}: restored tensors differ from the manifest (missing {missing}, "
            f"unexpected {extra})"
        )
    for path, tensor in found.items():
        if tensor_digest(tensor) != expected[path]["sha256"]:
            raise CheckpointError(f"{directory}: tensor {path} does not match the manifest")
