"""Resume chooses among checkpoints that prove to be this run's, at the step their name
says, intact: a renamed, swapped, copied, symlinked or foreign directory is refused like a
damaged one, every manifest field is checked before use, and ``latest`` is only a hint."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.run_layout import RunLayout
from reference_trainer.checkpoints import files
from reference_trainer.checkpoints.run_dir import check_resumable
from reference_trainer.errors import CheckpointError, RunDirError

from .test_checkpoint import Journal, _state, assert_same, manager


def saved(run_dir: Path, steps: tuple[int, ...] = (10, 20, 30)) -> Path:
    """A run with checkpoints at ``steps`` (10 full, the others deltas of it)."""
    m = manager(run_dir)
    for step in steps:
        m.save(step, _state(step))
    return RunLayout(run_dir).checkpoints


def resumed(run_dir: Path) -> tuple[str, dict[str, Any], list[str]]:
    """Where resume starts, the state it loads, and every refusal it journaled."""
    journal = Journal()
    start = check_resumable(run_dir)
    path, state = manager(run_dir, journal).load_valid()
    assert start == path  # the pre-check and the loader agree
    reasons = [fields["reason"] for kind, fields in journal.claims if kind == "checkpoint_rejected"]
    return path.name, state, reasons


def test_a_checkpoint_copied_under_a_higher_name_is_refused(tmp_path: Path) -> None:
    root = saved(tmp_path)
    shutil.copytree(root / "step-00000010", root / "step-00000090")
    name, state, reasons = resumed(tmp_path)
    assert name == "step-00000030" and state["step"] == 30
    assert "manifest is for step 10, not the step its name says" in reasons[0]


def test_swapped_checkpoints_are_both_refused(tmp_path: Path) -> None:
    root = saved(tmp_path)
    (root / "step-00000030").rename(root / "swap")
    (root / "step-00000020").rename(root / "step-00000030")
    (root / "swap").rename(root / "step-00000020")
    name, state, reasons = resumed(tmp_path)
    assert name == "step-00000010"
    assert_same(state, _state(10))
    assert len(reasons) == 2


def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path) -> None:
    root = saved(tmp_path / "mine", (10, 20))
    other = saved(tmp_path / "other", (10, 20, 30, 40))
    shutil.copytree(other / "step-00000040", root / "step-00000040")
    name, _, reasons = resumed(tmp_path / "mine")
    assert name == "step-00000020"
    assert "copied in from another run" in reasons[0]


@pytest.mark.parametrize("inside", [True, False])
def test_a_symlinked_checkpoint_is_never_followed(tmp_path: Path, inside: bool) -> None:
    root = saved(tmp_path / "mine", (10, 20))
    target = root / "step-00000020" if inside else saved(tmp_path / "other", (10, 50))
    (root / "step-00000050").symlink_to(target if inside else target / "step-00000050")
    name, _, _ = resumed(tmp_path / "mine")
    assert name == "step-00000020"
    file_link = root / "step-00000020" / "rng-rank-0.pt"  # a file swapped for a symlink
    real = file_link.with_name("real.pt")
    file_link.rename(real)
    file_link.symlink_to(real)
    name, _, reasons = resumed(tmp_path / "mine")
    assert name == "step-00000010" and "not a regular file" in reasons[0]


def edit_manifest(directory: Path, change: Any) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: m.update(parent="step-00000030"), "not an earlier step"),  # itself: a loop
        (lambda m: m.update(parent="step-00000090"), "not an earlier step"),
        (lambda m: m.update(parent="../../x"), "is not a checkpoint name"),
        (lambda m: m.update(parent=7), "is not a checkpoint name"),
        (lambda m: m.update(parent=None), "a delta checkpoint with parent None"),
        (lambda m: m["files"]["delta.bin"].pop("sha256"), "files.delta.bin is not"),
        (lambda m: m["files"]["delta.bin"].update(bytes="12"), "files.delta.bin is not"),
        (lambda m: m.pop("run_id"), "missing ['run_id']"),
        (lambda m: m.update(extra=1), "unexpected ['extra']"),
        (lambda m: m.update(step=True), "step True is not a step"),
        (lambda m: m.update(kind="sparse"), "kind 'sparse' is not one of"),
        (lambda m: m.update(format=1), "not a format-2 manifest"),
        (lambda m: m.update(files={}), "lists no files"),
        (lambda m: m["files"].update({"../x": m["files"]["delta.bin"]}), "not a plain file"),
        # Files intact, a tensor's digest changed: only a full load can tell, and the check
        # before resuming makes it, so it names the step the load really starts from.
        (lambda m: m["tensors"]["model.w"].update(sha256="0" * 64), "does not match the manifest"),
    ],
)
def test_every_manifest_field_is_checked_before_use(
    tmp_path: Path, change: Any, reason: str
) -> None:
    root = saved(tmp_path)
    edit_manifest(root / "step-00000030", change)
    name, _, reasons = resumed(tmp_path)
    assert name == "step-00000020"
    assert reason in reasons[0]


def test_a_delta_whose_parent_is_a_delta_is_refused(tmp_path: Path) -> None:
    root = saved(tmp_path)
    edit_manifest(root / "step-00000030", lambda m: m.update(parent="step-00000020"))
    name, _, reasons = resumed(tmp_path)
    assert name == "step-00000020"
    assert "parent step-00000020 is not full" in reasons[0]


@pytest.mark.parametrize(
    "form", ["empty", "garbage", "binary", "older", "missing", "directory", "symlink", "fifo"]
)
def test_resume_ignores_latest_in_any_form(tmp_path: Path, form: str) -> None:
    root = saved(tmp_path)
    pointer = root / "latest"
    pointer.unlink()
    if form == "empty":
        pointer.write_text("")
    elif form == "garbage":
        pointer.write_text("step-three\n")
    elif form == "binary":
        pointer.write_bytes(os.urandom(4096))
    elif form == "older":
        pointer.write_text("step-00000010\n")
    elif form == "directory":
        pointer.mkdir()
    elif form == "symlink":
        pointer.symlink_to("/etc/hostname")
    elif form == "fifo":
        os.mkfifo(pointer)
    name, state, reasons = resumed(tmp_path)
    assert name == "step-00000030" and state["step"] == 30 and not reasons
    manager(tmp_path).save(40, _state(40))  # the next save puts a pointer back
    assert files.latest_hint(tmp_path) == "step-00000040"


def test_no_valid_checkpoint_is_a_refusal_naming_each(tmp_path: Path) -> None:
    root = saved(tmp_path, (10, 20))
    for manifest in root.glob("step-*/manifest.json"):
        manifest.write_text("{")
    with pytest.raises(RunDirError, match=r"none of the 2 checkpoint\(s\) in .* is intact"):
        check_resumable(tmp_path)
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        manager(tmp_path).load_valid()


def test_a_run_that_never_finished_a_save_resumes_from_step_zero(tmp_path: Path) -> None:
    root = saved(tmp_path, (10,))
    shutil.rmtree(root / "step-00000010")
    (root / ".step-00000010.tmp").mkdir()  # the first save, killed mid-way
    assert check_resumable(tmp_path) is None
    assert files.remove_unfinished(tmp_path) == [root / ".step-00000010.tmp"]


def test_retention_never_deletes_what_is_not_this_runs(tmp_path: Path) -> None:
    root = saved(tmp_path / "mine", (10, 20))
    other = saved(tmp_path / "other", (10, 20, 30, 40))
    shutil.copytree(other / "step-00000040", root / "step-00000040")
    m = manager(tmp_path / "mine")
    m.keep = 2
    m.save(30, _state(30))
    left = [p.name for p in files.complete_checkpoints(tmp_path / "mine")]
    # The foreign 40 neither counts towards the two kept nor is deleted.
    assert left == ["step-00000010", "step-00000020", "step-00000030", "step-00000040"]
