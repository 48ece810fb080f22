"""What a run directory must hold before a command may touch it; checked before any write."""

from __future__ import annotations

import warnings
from pathlib import Path

from harness.journal import JOURNAL_DIR, read_journal
from reference_trainer.checkpoint import checkpoint_root, latest_checkpoint
from reference_trainer.errors import RunDirError


def check_fresh(run_dir: Path) -> None:
    """A fresh run must not land on top of another run's checkpoints or journal."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} exists and is not a directory")
    taken = [p.name for p in (checkpoint_root(run_dir), run_dir / JOURNAL_DIR) if p.exists()]
    if taken:
        raise RunDirError(
            f"--run-dir {run_dir} already holds a run ({' and '.join(taken)}); "
            "pass --resume to continue it, or choose another --run-dir"
        )


def check_resumable(run_dir: Path) -> Path:
    """The checkpoint a resume starts from; an error when there is none."""
    if not run_dir.is_dir():
        raise RunDirError(f"--resume: run dir {run_dir} does not exist")
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise RunDirError(f"--resume: {run_dir} holds no checkpoint to resume from")
    return latest


def lost_ranks(run_dir: Path, attempt: int) -> list[int]:
    """Ranks whose process in ``attempt`` started but never ended on its own (killed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a killed writer leaves a torn last line
        events = [e for e in read_journal(run_dir) if e.restart == attempt]
    started = {e.rank for e in events if e.kind == "run_start"}
    ended = {e.rank for e in events if e.kind == "run_end"}
    return sorted(started - ended)
