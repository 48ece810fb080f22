"""What a run directory must hold before a command may touch it; checked before any write."""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import TightropeError
from harness.records.events import RunEnd, RunStart, StepObserved
from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from reference_trainer.checkpoints.files import complete_checkpoints, read_run_id
from reference_trainer.checkpoints.manager import CheckpointConfig, CheckpointManager
from reference_trainer.errors import CheckpointError, RunDirError


def check_fresh(run_dir: Path) -> str | None:
    """A fresh run must not land on top of another run's checkpoints or trained steps.

    What a start-up killed before the first step left is no run: the fresh one starts over
    on it (`Run.start_up` removes it). Returns why it does, or None when ``run_dir`` holds
    nothing of a run."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} exists and is not a directory")
    why = unfinished_start(run_dir)
    if why is not None:
        return why
    layout = RunLayout(run_dir)
    if complete_checkpoints(run_dir):
        taken = [p.name for p in (layout.checkpoints, layout.journal) if p.exists()]
        raise RunDirError(
            f"--run-dir {run_dir} already holds a run ({' and '.join(taken)}); "
            "pass --resume to continue it, or choose another --run-dir"
        )
    if not any(path.exists() for path in layout.start_up_files()):
        return None
    if _trained(run_dir):
        raise RunDirError(
            f"--run-dir {run_dir} holds a run that never finished a checkpoint (its first "
            "save was interrupted, or it stopped before one); pass --resume to start it over "
            "from step 0 with its configuration, or choose another --run-dir"
        )
    return "it never trained a step"


def _trained(run_dir: Path) -> bool:
    """Whether the run's journal shows a step (an unreadable one counts as trained)."""
    if not RunLayout(run_dir).journal.is_dir():
        return False
    try:
        journal = read_journal(run_dir, warn=False)
    except TightropeError:
        return True
    return bool(journal.of_kind(StepObserved))


def unfinished_start(run_dir: Path) -> str | None:
    """Why ``run_dir`` holds a start-up that never finished (its configuration or run id
    missing or torn: the trainer was killed before both were written), or None.

    None as well when it holds nothing a start-up writes (see `holds_no_run`), and when it
    holds checkpoints (a run, whatever else it lacks: never removed as a start's
    leftovers)."""
    layout = RunLayout(run_dir)
    if not run_dir.is_dir() or complete_checkpoints(run_dir):
        return None
    if not any(path.exists() for path in layout.start_up_files()):
        return None
    try:
        json.loads(layout.config.read_bytes())
    except FileNotFoundError:
        return f"no {layout.config.name}"
    except (OSError, ValueError):
        return f"{layout.config.name} is torn or unreadable"
    try:
        read_run_id(run_dir)
    except CheckpointError:
        return f"no {layout.run_id.name} beside {layout.config.name}"
    return None


def holds_no_run(run_dir: Path) -> bool:
    """``run_dir`` does not exist, or holds nothing but what comes before a start-up
    writes: its claim, a runner's plan and log (a start killed right after claiming it; a
    folder made for the run). A folder holding anything else is not taken for a run's.

    Not there at all counts too: rank 0 makes a missing run dir as it claims it, and a
    rank of the same job that looks before that must come to the same answer (a two-rank
    job killed before its start made the dir, resumed, had rank 1 refuse it: "--resume:
    run dir ... does not exist")."""
    if not run_dir.exists():
        return True
    layout = RunLayout(run_dir)
    try:
        names = {path.name for path in run_dir.iterdir()}
    except OSError:
        return False
    return names <= {layout.lock.name, layout.plan.name, layout.log.name}


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
    started = {e.rank for e in events if e.is_(RunStart)}
    ended = {e.rank for e in events if e.is_(RunEnd)}
    return sorted(started - ended)
