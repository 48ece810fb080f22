"""A run directory's files carried between machines: packed into one tar on the node that
ran it, unpacked (or copied from a shared path) into the run dir the driver judges.

What judging reads goes (the journal, microscope, trainer log, plan, samples, everything
the run wrote), but the checkpoints only when a check reads them: a run's weights are the
bulk of its bytes. The run dir's lock is its owner's and never travels.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from harness.run_layout import RunLayout

#: The checks that read a run's checkpoint files (a manifest, the weights it samples).
READ_CHECKPOINTS = frozenset({"no_corrupt_checkpoint_loaded", "max_phrase_collapse"})


def _skipped(run_dir: Path, checkpoints: bool) -> set[Path]:
    layout = RunLayout(run_dir)
    return {layout.lock} | (set() if checkpoints else {layout.checkpoints})


def pack(run_dir: Path, *, checkpoints: bool) -> bytes:
    """The run dir's files as one gzipped tar (paths relative to it)."""
    skip = _skipped(run_dir, checkpoints)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(run_dir.iterdir()):
            if path not in skip:
                tar.add(path, arcname=path.name)
    return buffer.getvalue()


def unpack(data: bytes, run_dir: Path) -> None:
    """Unpack what `pack` made into ``run_dir``; a member that would land outside it, or is
    a device or a link out, is refused (tarfile's ``data`` filter)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(run_dir, filter="data")


def copy_run(source: Path, run_dir: Path, *, checkpoints: bool) -> None:
    """Copy a run dir written on a shared path into ``run_dir``, as `pack` would carry it."""
    skip = _skipped(source, checkpoints)
    run_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path in skip:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.copytree(path, run_dir / path.name, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(path, run_dir / path.name, follow_symlinks=False)
