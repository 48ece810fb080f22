"""Checking a checkpoint on disk against its manifest, without the trainer's code.

The format is the reference trainer's (`reference_trainer/checkpoints/manifest.py`): a directory
holds ``manifest.json``, a JSON object whose ``files`` maps each file name to its
``bytes`` and ``sha256``, whose ``kind`` is ``full`` or ``delta`` and whose ``parent``
names the checkpoint a delta was encoded against, a sibling directory (or null). This
reader is written again on purpose: an oracle that imported the trainer's verifier would
share its bugs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from faults.checkpoint_tree import MANIFEST as MANIFEST  # re-exported
from faults.checkpoint_tree import STEP_NAME as _STEP_NAME

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What a checkpoint directory holds now, and which directories that took reading."""

    #: intact: every file matches; corrupt: something does not; missing: it is gone.
    status: Literal["intact", "corrupt", "missing"]
    #: Why it is not intact; empty when it is.
    reason: str
    #: Names of the directories read: the checkpoint, then its delta's parents.
    chain: tuple[str, ...]


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _plain_name(value: Any) -> bool:
    """True for a file or directory name that stays inside its folder."""
    return isinstance(value, str) and value not in ("", ".", "..") and Path(value).name == value


def read_manifest(directory: Path) -> tuple[dict[str, Any] | None, str]:
    """The manifest of ``directory`` and "", or None and what is wrong with it."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return None, f"{path} is unreadable: {exc}"
    if not isinstance(manifest, dict):
        return None, f"{path} is not a JSON object"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return None, f"{path} lists no files"
    for name, entry in files.items():
        if not _plain_name(name):
            return None, f"{path} lists {name!r}, which is not a plain file name"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("bytes"), int)
            or not isinstance(entry.get("sha256"), str)
        ):
            return None, f"{path}: files.{name} lacks an int bytes and a str sha256"
    if "parent" not in manifest:
        return None, f"{path} lacks 'parent'"
    return manifest, ""


def verify_files(directory: Path, files: dict[str, Any]) -> str:
    """ "" when every listed file has its size and hash, else the first mismatch."""
    for name, entry in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != entry["bytes"]:
            return f"{path} has {size} bytes, the manifest says {entry['bytes']}"
        try:
            digest = sha256_file(path)
        except OSError as exc:
            return f"{path} is unreadable: {exc.strerror}"
        if digest != entry["sha256"].lower():
            return f"{path} does not match its SHA-256 in the manifest"
    return ""


def _mislabelled(directory: Path, manifest: dict[str, Any]) -> str:
    """What is wrong when a ``step-NNNNNNNN`` folder holds another step's manifest (a
    renamed, swapped or copied checkpoint); "" otherwise."""
    match = _STEP_NAME.fullmatch(directory.name)
    step = manifest.get("step")
    if match and isinstance(step, int) and int(match.group(1)) != step:
        return f"{directory} holds the manifest of step {step}, not of the step its name says"
    return ""


def inspect_checkpoint(directory: Path) -> CheckpointState:
    """Check ``directory`` and, for a delta, every parent it needs."""
    chain: list[str] = []
    current = directory
    while True:
        if current.name in chain:
            return CheckpointState("corrupt", f"{current} is its own ancestor", tuple(chain))
        chain.append(current.name)
        if not current.is_dir():
            return CheckpointState("missing", f"{current} no longer exists", tuple(chain))
        manifest, problem = read_manifest(current)
        if manifest is None:
            return CheckpointState("corrupt", problem, tuple(chain))
        problem = _mislabelled(current, manifest)
        if problem:
            return CheckpointState("corrupt", problem, tuple(chain))
        problem = verify_files(current, manifest["files"])
        if problem:
            return CheckpointState("corrupt", problem, tuple(chain))
        if manifest.get("kind") != "delta":
            return CheckpointState("intact", "", tuple(chain))
        parent = manifest["parent"]
        if not _plain_name(parent):
            return CheckpointState(
                "corrupt", f"{current} is a delta without a parent checkpoint", tuple(chain)
            )
        current = current.parent / parent
