"""Checkpoint manifests: what a checkpoint must contain, hashed, so that a damaged one is
refused before its contents are trusted.

``manifest.json`` is the last file written into a checkpoint directory. It names every
file with its size and SHA-256, and every tensor of the restored state with its shape,
dtype and the SHA-256 of its raw bytes (so a delta, once decoded, is checked too), plus
the step, the kind (full or delta) and the parent checkpoint. It is plain JSON: reading
it never runs code.

A manifest also says who wrote it: the run's id (``RUN_DIR/run-id``, written when the run
starts) and the step, which must match the directory's name. A checkpoint copied in from
another run, renamed, swapped or symlinked is therefore refused like a damaged one, and
every field is checked for its type before anything reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from faults.checkpoint_tree import MANIFEST as MANIFEST  # re-exported
from faults.checkpoint_tree import STEP_NAME as _STEP_NAME
from reference_trainer.checkpoints.files import read_plain
from reference_trainer.errors import CheckpointError

FORMAT = 2
KINDS = ("full", "delta")
MAX_BYTES = 64 << 20
_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_RUN_ID = re.compile(r"[0-9a-f]{32}")
_FIELDS = {"format", "run_id", "step", "kind", "parent", "files", "tensors"}


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
    directory: Path,
    *,
    run_id: str,
    step: int,
    kind: str,
    parent: str | None,
    tensors: dict[str, Any],
) -> dict[str, Any]:
    """Hash every file in ``directory`` and write the manifest last, fsynced."""
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "format": FORMAT,
        "run_id": run_id,
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
    """The manifest of a checkpoint, every field checked; an error naming what is wrong
    when it is unusable."""
    path = directory / MANIFEST
    try:
        raw = read_plain(path, MAX_BYTES)
        if raw is None:
            raise CheckpointError(f"{path} is not a regular file")
        if len(raw) > MAX_BYTES:
            raise CheckpointError(f"{path} is over {MAX_BYTES >> 20} MiB; not a manifest")
        manifest = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing (the save never finished, or it was deleted)"
        ) from None
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{path} is unreadable: {exc}") from exc
    problem = manifest_problem(manifest)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    return dict(manifest)


def manifest_problem(manifest: Any) -> str:
    """What is wrong with a manifest's fields, or "" when every one has its type."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("format") != FORMAT:
        return f"not a format-{FORMAT} manifest (format {manifest.get('format')!r})"
    if set(manifest) != _FIELDS:
        missing, extra = sorted(_FIELDS - set(manifest)), sorted(set(manifest) - _FIELDS)
        return f"fields differ from a manifest's (missing {missing}, unexpected {extra})"
    if not (isinstance(manifest["run_id"], str) and _RUN_ID.fullmatch(manifest["run_id"])):
        return f"run_id {manifest['run_id']!r} is not a run id"
    if not _is_int(manifest["step"]) or manifest["step"] < 0:
        return f"step {manifest['step']!r} is not a step"
    if manifest["kind"] not in KINDS:
        return f"kind {manifest['kind']!r} is not one of {', '.join(KINDS)}"
    parent = manifest["parent"]
    if (manifest["kind"] == "delta") != (parent is not None):
        return f"a {manifest['kind']} checkpoint with parent {parent!r}"
    if parent is not None and not (isinstance(parent, str) and _STEP_NAME.fullmatch(parent)):
        return f"parent {parent!r} is not a checkpoint name"
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        return "lists no files"
    for name, entry in files.items():
        if not (isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name):
            return f"lists {name!r}, which is not a plain file name"
        if not (
            isinstance(entry, dict)
            and set(entry) == {"bytes", "sha256"}
            and _is_int(entry["bytes"])
            and entry["bytes"] >= 0
            and isinstance(entry["sha256"], str)
            and _HEX64.fullmatch(entry["sha256"])
        ):
            return f"files.{name} is not {{bytes: int, sha256: hex}}"
    tensors = manifest["tensors"]
    if not isinstance(tensors, dict):
        return "tensors is not a mapping"
    for name, entry in tensors.items():
        if not (
            isinstance(entry, dict)
            and set(entry) == {"shape", "dtype", "sha256"}
            and isinstance(entry["shape"], list)
            and all(_is_int(n) and n >= 0 for n in entry["shape"])
            and isinstance(entry["dtype"], str)
            and isinstance(entry["sha256"], str)
            and _HEX64.fullmatch(entry["sha256"])
        ):
            return f"tensors.{name} is not {{shape, dtype, sha256}}"
    return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_identity(directory: Path, manifest: dict[str, Any], run_id: str) -> None:
    """The checkpoint is this run's, taken at the step its directory's name says, and is
    a real directory (a symlink could lead anywhere)."""
    if directory.is_symlink():
        raise CheckpointError(f"{directory} is a symlink; a checkpoint is a real directory")
    match = _STEP_NAME.fullmatch(directory.name)
    if match is None or int(match.group(1)) != manifest["step"]:
        raise CheckpointError(
            f"{directory}: its manifest is for step {manifest['step']}, not the step its "
            "name says (a renamed, swapped or copied checkpoint)"
        )
    if manifest["run_id"] != run_id:
        raise CheckpointError(
            f"{directory}: its manifest is from run {manifest['run_id'][:12]}, not this run "
            f"({run_id[:12]}); a checkpoint copied in from another run"
        )


def verify_files(directory: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest names is a regular file (no symlink) with its size and
    hash."""
    for name, expected in manifest["files"].items():
        path = directory / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing") from None
        except OSError as exc:
            raise CheckpointError(f"{path} is unreadable: {exc.strerror}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path} is not a regular file (a symlink or worse)")
        if info.st_size != expected["bytes"]:
            raise CheckpointError(
                f"{path} has {info.st_size} bytes, the manifest says {expected['bytes']}"
            )
        try:
            digest = file_digest(path)
        except OSError as exc:
            raise CheckpointError(f"{path} is unreadable: {exc.strerror}") from exc
        if digest != expected["sha256"]:
            raise CheckpointError(f"{path} does not match its hash in the manifest")


def verify_tensors(directory: Path, manifest: dict[str, Any], state: Any) -> None:
    """The restored state holds exactly the manifest's tensors, bit for bit, with their
    shapes and dtypes, and is the state of the manifest's step."""
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
        want = expected[path]
        if (
            list(tensor.shape) != want["shape"]
            or str(tensor.dtype).removeprefix("torch.") != want["dtype"]
            or tensor_digest(tensor) != want["sha256"]
        ):
            raise CheckpointError(f"{directory}: tensor {path} does not match the manifest")
    if isinstance(state, dict) and state.get("step") != manifest["step"]:
        raise CheckpointError(
            f"{directory}: holds the state of step {state.get('step')!r}, "
            f"the manifest says {manifest['step']}"
        )
