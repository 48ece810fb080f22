"""Why a checkpoint could not be written, in words a person acts on: disk full, file too
large, with the path and the bytes it needed.

``torch.save`` into a full disk or past the process's file-size limit (``ulimit -f``) does
not say so: its zip writer ends in ``[enforce fail at inline_container.cc:...] unexpected
pos N vs M`` with the ``errno`` lost. So when a save fails without an ``errno`` that names
the cause, the free space (``shutil.disk_usage``) and the file-size limit are looked at
against what the save needed.
"""

from __future__ import annotations

import errno
import resource
import shutil
from pathlib import Path
from typing import Any

import torch

from reference_trainer.errors import SaveError


def state_bytes(state: Any) -> int:
    """The bytes of every tensor in a nested state (what its file needs, give or take the
    pickled structure around them)."""
    if isinstance(state, torch.Tensor):
        return int(state.numel() * state.element_size())
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def _file_size_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def explain(exc: BaseException, path: Path, needed: int) -> str:
    """What went wrong writing ``path`` (about ``needed`` bytes), in words."""
    code = exc.errno if isinstance(exc, OSError) else None
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    limit = _file_size_limit()
    if code == errno.ENOSPC or (code is None and free is not None and free < needed):
        have = f"{free:,} bytes free there" if free is not None else "the free space unknown"
        return f"disk full: writing {path} needs about {needed:,} bytes, {have}"
    if code == errno.EFBIG or (code is None and limit is not None and needed > limit):
        cap = f"the file-size limit of {limit:,} bytes (ulimit -f)" if limit else "a file size"
        return f"file too large: writing {path} needs about {needed:,} bytes, past {cap}"
    if code == errno.EDQUOT:
        return f"disk quota exceeded: writing {path} needs about {needed:,} bytes"
    return f"cannot write {path}: {type(exc).__name__}: {exc}"


def save_failed(exc: BaseException, path: Path, needed: int, step: int) -> SaveError:
    """The error a failed save of step ``step`` ends training with."""
    return SaveError(f"checkpoint of step {step} not saved: {explain(exc, path, needed)}")
