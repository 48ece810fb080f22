"""What a run directory must hold before a command may touch it; checked before any write."""

from __future__ import annotations

from pathlib import Path

from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from reference_trainer.checkpoints.files import complete_checkpoints, read_run_id
from reference_trainer.checkpoints.manager import CheckpointConfig, CheckpointManager
from reference_trainer.errors import CheckpointError, RunDirError


def check_fresh(run_dir: Path) -> None:
    """A fresh run must not land on top of another run's checkpoints or journal."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} exists and is not a directory")
    layout = RunLayout(run_dir)
    taken = [p.name for p in (layout.checkpoints, layout.journal) if p.exists()]
    if not taken:
        return
    if not complete_checkpoints(run_dir):
        raise RunDirError(
            f"--run-dir {run_dir} holds a run that never finished a checkpoint (its first "
            "save was interrupted, or it stopped before one); pass --resume to start it over "
            "from step 0 with its configuration, or choose another --run-dir"
        )
    raise RunDirError(
        f"--run-dir {run_dir} already holds a run ({' and '.join(taken)}); "
        "pass --resume to continue it, or choose another --run-dir"
    )


def check_run(run_dir: Path) -> None:
    """``--resume`` needs a run: the directory and the configuration it was started with."""
    if not run_dir.is_dir():
        raise RunDirError(f"--resume: run dir {run_dir} does not exist")
    config = RunLayout(run_dir).config
    if not config.is_file():
        raise RunDirError(f"--resume: {run_dir} holds no run to resume (no {config.name})")


def check_resumable(run_dir: Path, *, integrity: bool = True) -> Path | None:
    """The checkpoint a resume starts from: the newest that proves to be this run's, at
    its name's step, intact, state and all (``latest`` is only a hint). None when the run
    never finished a checkpoint: it starts over from step 0. An error when checkpoints
    exist but none is usable. Without ``integrity`` the one ``latest`` names is taken on
    trust, as the trainer will."""
    if not run_dir.is_dir():
        raise RunDirError(f"--resume: run dir {run_dir} does not exist")
    found = complete_checkpoints(run_dir)
    if not found:
        return None
    reasons: list[str] = []
    manager = CheckpointManager(
        run_dir,
        CheckpointConfig(integrity=integrity),
        rank=0,
        keep=len(found),
        barrier=lambda: None,
        claim=lambda rejected, step=None: reasons.append(rejected.reason),
    )
    if not integrity:
        return manager.candidates()[0]
    try:
        read_run_id(run_dir)
    except CheckpointError as exc:
        raise RunDirError(f"--resume: {exc}") from None
    try:
        # The very load the trainer will make, so the step named here is the one it resumes.
        path, _ = manager.load_valid()
    except CheckpointError:
        pass
    else:
        return path
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    raise RunDirError(
        f"--resume: none of the {len(found)} checkpoint(s) in {RunLayout(run_dir).checkpoints} is "
        f"intact and this run's ({shown})"
    )


def lost_ranks(run_dir: Path, attempt: int) -> list[int]:
    """Ranks whose process in ``attempt`` started but never ended on its own (killed)."""
    # (a killed writer leaves a torn last line)
    events = [e for e in read_journal(run_dir, warn=False) if e.restart == attempt]
    started = {e.rank for e in events if e.kind == "run_start"}
    ended = {e.rank for e in events if e.kind == "run_end"}
    return sorted(started - ended)
