"""The corrupt-checkpoint oracle checks real checkpoint folders, written in the reference
trainer's manifest format and damaged by the real checkpoint faults."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from faults.checkpoint import (
    BitflipFileInjector,
    BitflipFileSpec,
    DeleteManifestInjector,
    DeleteManifestSpec,
    TruncateInjector,
    TruncateSpec,
)
from faults.injector import Injection
from harness.oracles import NoCorruptCheckpointLoadedOracle
from harness.oracles.manifests import inspect_checkpoint
from harness.oracles.verdict import Check
from harness.run_layout import RunLayout
from reference_trainer.checkpoints.manifest import write_manifest

from .oracle_runs import TARGET, Run

FULL, DELTA = "step-00000010", "step-00000020"


def damage(injector: Any, run_dir: Path) -> list[Injection]:
    """Apply a checkpoint fault to the run in ``run_dir`` as the agent does: with the run's
    checkpoint folder."""
    return list(injector.apply(run_dir, checkpoints=RunLayout(run_dir).checkpoints))


def save(run_dir: Path, name: str, data: bytes, parent: str | None = None) -> Path:
    """A checkpoint folder as the reference trainer writes one: data, RNG, manifest."""
    folder = run_dir / "checkpoints" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("delta.bin" if parent else "state.pt")).write_bytes(data)
    (folder / "rng-rank-0.pt").write_bytes(b"rng" * 50)
    step = int(name.removeprefix("step-"))
    kind = "delta" if parent else "full"
    write_manifest(folder, run_id="0" * 32, step=step, kind=kind, parent=parent, tensors={})
    (run_dir / "checkpoints" / "latest").write_text(name + "\n")
    return folder


def saved_run(run_dir: Path, world_size: int = 1) -> Run:
    """Checkpoints at steps 10 (full) and 20 (a delta on it), journaled as saved."""
    run = Run(run_dir, world_size).steps(1, 10)
    run.emit("checkpoint_saved", 10, path=str(save(run_dir, FULL, bytes(range(256)) * 40)))
    run.steps(11, 20)
    folder = save(run_dir, DELTA, b"delta" * 300, parent=FULL)
    return run.emit("checkpoint_saved", 20, path=str(folder))


def journal_damage(run: Run, step: int, records: list[Injection], rank: int = 0) -> None:
    """Journal what a fault did, as the agent does."""
    for rec in records:
        run.emit(
            "fault_injected", step, rank, fault=rec.fault, target=rec.target, details=rec.details
        )


def resume(run: Run, step: int = 25) -> Check:
    """Roll back to the delta at step 20, finish, and judge."""
    run.steps(21, step).rollback(step, to=20).steps(21, TARGET).end()
    return NoCorruptCheckpointLoadedOracle().judge(run.evidence())


def test_loading_an_intact_delta_and_its_parent_passes(tmp_path: Path) -> None:
    check = resume(saved_run(tmp_path))
    assert check.passed, check.detail
    assert (check.figure, check.figures) == (0, {"loads": 1, "unverifiable": 0})
    assert check.expected == "0 corrupt loads"


def test_silent_damage_to_a_loaded_checkpoint_fails(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    # Nobody journals this bit flip: only the files can tell.
    damage(BitflipFileInjector(BitflipFileSpec(at_step=1, checkpoint=DELTA)), tmp_path)
    check = resume(run)
    assert not check.passed and check.figure == 1
    assert "delta.bin does not match its SHA-256" in check.detail


def test_a_checkpoint_renamed_into_the_loaded_step_is_corrupt(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    root = tmp_path / "checkpoints"
    shutil.rmtree(root / DELTA)
    shutil.copytree(root / FULL, root / DELTA)  # step 10's intact files under step 20's name
    check = resume(run)
    assert not check.passed and check.figure == 1
    assert "holds the manifest of step 10, not of the step its name says" in check.detail


def test_a_delta_with_a_damaged_parent_is_corrupt(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    damage(TruncateInjector(TruncateSpec(at_step=1, checkpoint=FULL)), tmp_path)
    check = resume(run)
    assert not check.passed and "state.pt has" in check.detail


def test_a_missing_manifest_is_corrupt(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    journal_damage(run, 22, damage(DeleteManifestInjector(DeleteManifestSpec(at_step=1)), tmp_path))
    check = resume(run)
    assert not check.passed and "delete_manifest hit step-00000020 at step 22" in check.detail


def test_damage_journaled_before_the_load_fails_even_once_the_files_are_gone(
    tmp_path: Path,
) -> None:
    run = saved_run(tmp_path)
    journal_damage(run, 21, damage(BitflipFileInjector(BitflipFileSpec(at_step=1)), tmp_path))
    run.steps(21, 25).rollback(25, to=20).steps(21, TARGET).end()
    shutil.rmtree(tmp_path / "checkpoints")  # retention, or a cleanup, after the run
    check = NoCorruptCheckpointLoadedOracle().judge(run.evidence())
    assert not check.passed and "bitflip_file hit step-00000020 at step 21" in check.detail


def test_damage_after_the_load_is_not_blamed_on_it(tmp_path: Path) -> None:
    run = saved_run(tmp_path).steps(21, 25).rollback(25, to=20)
    journal_damage(run, 26, damage(TruncateInjector(TruncateSpec(at_step=1)), tmp_path))
    # A later load of the untouched step 10 is one the files can still vouch for.
    run.steps(21, 28).rollback(28, to=10).steps(11, TARGET).end()
    check = NoCorruptCheckpointLoadedOracle().judge(run.evidence())
    assert check.passed, check.detail
    assert check.figures == {"loads": 2, "unverifiable": 1}


def test_a_checkpoint_saved_again_after_its_damage_is_a_new_one(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    journal_damage(run, 21, damage(TruncateInjector(TruncateSpec(at_step=1)), tmp_path))
    run.rollback(21, to=10).steps(11, 20)  # the damaged step 20 is never loaded...
    folder = save(tmp_path, DELTA, b"again" * 300, parent=FULL)  # ...and is saved anew
    run.emit("checkpoint_saved", 20, path=str(folder))
    check = resume(run)
    assert check.passed, check.detail
    assert check.figures == {"loads": 2, "unverifiable": 0}


def test_a_deleted_checkpoint_is_unverifiable_so_not_judged(tmp_path: Path) -> None:
    run = saved_run(tmp_path).steps(21, 25).rollback(25, to=20).steps(21, TARGET).end()
    shutil.rmtree(tmp_path / "checkpoints" / DELTA)
    check = NoCorruptCheckpointLoadedOracle().judge(run.evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert check.figures == {"loads": 1, "unverifiable": 1}
    assert "none verifiable" in check.detail


def test_damage_after_the_only_load_leaves_it_not_judged(tmp_path: Path) -> None:
    run = saved_run(tmp_path).steps(21, 25).rollback(25, to=20)
    journal_damage(run, 26, damage(TruncateInjector(TruncateSpec(at_step=1)), tmp_path))
    run.steps(21, TARGET).end()
    check = NoCorruptCheckpointLoadedOracle().judge(run.evidence())
    # Not blamed (not corrupt), but no longer provably intact either.
    assert check.status == "not judged" and not check.passed
    assert check.figures == {"loads": 1, "unverifiable": 1}


def test_a_moved_run_directory_is_still_checked(tmp_path: Path) -> None:
    run = saved_run(tmp_path / "ran-here")
    damage(BitflipFileInjector(BitflipFileSpec(at_step=1, checkpoint=DELTA)), run.run_dir)
    run.steps(21, 25).rollback(25, to=20).steps(21, TARGET).end()
    run.close()
    moved = tmp_path / "copied-there"
    shutil.move(run.run_dir, moved)
    run.run_dir = moved
    check = NoCorruptCheckpointLoadedOracle().judge(run.evidence())
    assert not check.passed and "does not match" in check.detail


def test_no_load_is_not_judged(tmp_path: Path) -> None:
    # Nothing loaded means nothing was checked, not that nothing corrupt was loaded.
    run = saved_run(tmp_path).steps(21, TARGET).end()
    check = NoCorruptCheckpointLoadedOracle().judge(run.evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert check.detail.startswith("no checkpoint load was observed")
    assert check.figures == {"loads": 0, "unverifiable": 0}


def raced_load(run_dir: Path, fault_step: int, *, read_damaged: bool = False) -> Check:
    """Two ranks roll back to step 20 at step 25; rank 0 loads, then its bit flip hits the
    folder at ``fault_step``; rank 1 reports its load of that folder after the flip, its
    agent's check of the folder (made then) corrupt. With ``read_damaged``, rank 1's agent
    also hashed the bytes it loaded and they match no save of the file."""
    run = saved_run(run_dir, world_size=2).steps(21, 25)
    folder = run_dir / "checkpoints" / DELTA
    run.emit("checkpoint_loaded", 25, 0, path=str(folder), verified="intact")
    flip = BitflipFileInjector(BitflipFileSpec(at_step=1, checkpoint=DELTA))
    journal_damage(run, fault_step, damage(flip, run_dir))
    if read_damaged:
        path, sha = str(folder / "delta.bin"), "b" * 64
        run.emit("file_loaded", 25, 1, path=path, sha256=sha, saved_step=20, intact=False)
    reason = "delta.bin does not match its SHA-256"
    run.emit(
        "checkpoint_loaded", 25, 1, path=str(folder), verified="corrupt", verified_reason=reason
    )
    run.steps(21, TARGET).end()
    return NoCorruptCheckpointLoadedOracle().judge(run.evidence())


def test_a_load_racing_a_fault_on_another_rank_is_not_called_corrupt(tmp_path: Path) -> None:
    # The agent's check came after the flip: it says nothing of the bytes rank 1 read.
    check = raced_load(tmp_path / "raced", 25)
    assert check.passed, check.detail
    assert check.figures == {"loads": 2, "unverifiable": 1}
    # Negative control: the same flip a step before the load is damage rank 1 loaded.
    check = raced_load(tmp_path / "earlier", 24)
    assert not check.passed and "bitflip_file hit step-00000020 at step 24" in check.detail


def test_bytes_seen_damaged_when_loaded_fail_even_while_a_fault_races(tmp_path: Path) -> None:
    check = raced_load(tmp_path, 25, read_damaged=True)
    assert not check.passed and check.figure == 1
    assert "delta.bin (its bytes differ from those saved at step 20)" in check.detail


def test_a_load_that_raised_loaded_nothing_corrupt(tmp_path: Path) -> None:
    # A framework refused its truncated newest checkpoint (the load raised) and the job
    # ended: no corrupt bytes went into the model.
    run = Run(tmp_path / "refused").steps(1, 18)
    snap = str(tmp_path / "ckpt" / "model.safetensors")
    run.emit("file_load_failed", 16, path=snap, sha256="c", intact=False, error="torn")
    check = NoCorruptCheckpointLoadedOracle().judge(run.end("failed", 16).evidence(exit_code=1))
    assert check.passed and check.figure == 0
    assert "1 raised, so loaded nothing" in check.detail
    # Negative control: the same refusal, then the damaged bytes loaded on another try.
    run = Run(tmp_path / "took").steps(1, 18)
    run.emit("file_load_failed", 16, path=snap, sha256="c", intact=False, error="torn")
    run.emit("file_loaded", 16, path=snap, sha256="c", saved_step=16, intact=False)
    check = NoCorruptCheckpointLoadedOracle().judge(run.steps(17, TARGET).end().evidence())
    assert not check.passed and check.figure == 1


def flipped_and_loaded(run_dir: Path, flips: int) -> tuple[Check, bytes]:
    """Two ranks at step 21; ``flips`` ranks each apply the same seeded bit flip to the
    step-20 delta (a fault scoped to every rank of a shared folder), then at step 25 both
    load it, each journaling the agent's own check of the folder then (as the agent does).
    Returns the check and the delta's bytes as loaded."""
    run = saved_run(run_dir, world_size=2).steps(21, 21)
    flip = BitflipFileInjector(BitflipFileSpec(at_step=1, checkpoint=DELTA))
    for rank in range(flips):
        journal_damage(run, 21, damage(flip, run_dir), rank=rank)
    folder = run_dir / "checkpoints" / DELTA
    run.steps(22, 25)
    for rank in (0, 1):
        state = inspect_checkpoint(folder)
        run.emit("checkpoint_loaded", 25, rank, path=str(folder), verified=state.status)
    run.steps(21, TARGET).end()
    loaded = (folder / "delta.bin").read_bytes()
    return NoCorruptCheckpointLoadedOracle().judge(run.evidence()), loaded


def test_a_bit_flipped_twice_is_back_and_its_load_is_intact(tmp_path: Path) -> None:
    # Both ranks flipped the same bit of the one shared file: the bytes the ranks loaded
    # are the bytes saved, whatever the two fault records say.
    check, loaded = flipped_and_loaded(tmp_path / "twice", flips=2)
    assert loaded == b"delta" * 300
    assert check.passed, check.detail
    assert check.figures == {"loads": 2, "unverifiable": 0}
    # Negative control: flipped once, the bytes loaded differ from those saved.
    check, loaded = flipped_and_loaded(tmp_path / "once", flips=1)
    assert loaded != b"delta" * 300
    assert not check.passed and check.figure == 2
    assert "bitflip_file hit step-00000020 at step 21" in check.detail
