"""Checkpoint faults damage real checkpoint files exactly as their spec asks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from faults.checkpoint import (
    BitflipFileInjector,
    BitflipFileSpec,
    DeleteFileInjector,
    DeleteFileSpec,
    DeleteManifestInjector,
    DeleteManifestSpec,
    StaleLatestInjector,
    StaleLatestSpec,
    SwapInjector,
    SwapSpec,
    TruncateInjector,
    TruncateSpec,
    ZeroPageInjector,
    ZeroPageSpec,
)
from faults.errors import FaultSpecError, InjectionError
from faults.injector import Injection, StepContext
from faults.registry import build_injector, kinds, parse_fault
from harness.run_layout import RunLayout

STEPS = (10, 20, 30)


def damage(injector: Any, run_dir: Path) -> list[Injection]:
    """Apply a checkpoint fault to the run in ``run_dir`` as the agent does: with the run's
    checkpoint folder."""
    return list(injector.apply(run_dir, checkpoints=RunLayout(run_dir).checkpoints))


def make_run(run_dir: Path, steps: tuple[int, ...] = STEPS, root: str = "checkpoints") -> Path:
    """A run directory with real checkpoints (state, two RNG files, manifest) and latest."""
    ckpts = run_dir / root
    for step in steps:
        d = ckpts / f"step-{step:08d}"
        d.mkdir(parents=True)
        weights = torch.arange(6000, dtype=torch.float32) * step  # ~24 KB: several pages
        torch.save({"step": step, "model": {"w": weights}}, d / "state.pt")
        for rank in (0, 1):
            torch.save({"torch": torch.full((50,), step * 10 + rank)}, d / f"rng-rank-{rank}.pt")
        (d / "manifest.json").write_text(f'{{"step": {step}}}\n')
    (ckpts / ".step-00000040.tmp").mkdir()  # a save in progress: never a target
    (ckpts / ".step-00000040.tmp" / "state.pt").write_bytes(b"partial")
    (ckpts / "latest").write_text(f"step-{steps[-1]:08d}\n")
    return run_dir


def snapshot(path: Path) -> dict[str, bytes | None]:
    """Every file's bytes (None for folders), by relative path."""
    return {
        p.relative_to(path).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(path.rglob("*"))
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run")


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


def changed(before: dict[str, bytes | None], after: dict[str, bytes | None]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k, b"?") != after.get(k, b"?")}


def test_bitflip_flips_exactly_one_bit_at_the_recorded_offset(run: Path) -> None:
    before = snapshot(run)
    [rec] = damage(BitflipFileInjector(BitflipFileSpec(at_step=1, seed=3)), run)
    after = snapshot(run)
    name = "checkpoints/step-00000030/state.pt"
    assert changed(before, after) == {name}
    old, new = before[name], after[name]
    assert old is not None and new is not None and len(old) == len(new)
    diffs = [i for i in range(len(old)) if old[i] != new[i]]
    assert diffs == [rec.details["offset"]]
    assert old[diffs[0]] ^ new[diffs[0]] == 1 << rec.details["bit"]
    assert rec.target == str(ckpt(run, 30) / "state.pt")
    assert rec.details["size_before"] == rec.details["size_after"] == len(old)


def test_bitflip_explicit_offset_bit_and_glob(run: Path) -> None:
    spec = BitflipFileSpec(at_step=1, checkpoint="previous", file="rng-*.pt", offset=7, bit=5)
    before = snapshot(run)
    records = damage(BitflipFileInjector(spec), run)
    after = snapshot(run)
    files = {f"checkpoints/step-00000020/rng-rank-{r}.pt" for r in (0, 1)}
    assert changed(before, after) == files and len(records) == 2
    for name in files:
        old, new = before[name], after[name]
        assert old is not None and new is not None
        assert [i for i in range(len(old)) if old[i] != new[i]] == [7]
        assert old[7] ^ new[7] == 32


def test_bitflip_is_deterministic_per_seed(tmp_path: Path) -> None:
    def flip(seed: int, where: str) -> tuple[int, int]:
        run = make_run(tmp_path / where)
        [rec] = damage(BitflipFileInjector(BitflipFileSpec(at_step=1, seed=seed)), run)
        return rec.details["offset"], rec.details["bit"]

    assert flip(11, "a") == flip(11, "b")
    assert len({flip(seed, f"s{seed}") for seed in range(4)}) > 1


def test_truncate_keeps_the_fraction(run: Path) -> None:
    old = (ckpt(run, 30) / "state.pt").read_bytes()
    [rec] = damage(TruncateInjector(TruncateSpec(at_step=1, keep_fraction=0.25)), run)
    new = (ckpt(run, 30) / "state.pt").read_bytes()
    assert len(new) == int(len(old) * 0.25) == rec.details["size_after"]
    assert new == old[: len(new)]
    with pytest.raises(Exception):  # noqa: B017 - any torch error: the file is damaged
        torch.load(ckpt(run, 30) / "state.pt", weights_only=True)


@pytest.mark.parametrize("offset", [None, 8192, 20480])
def test_zero_page_zeros_exactly_one_page(run: Path, offset: int | None) -> None:
    before = snapshot(run)
    spec = ZeroPageSpec(at_step=1, offset=offset, seed=5)
    [rec] = damage(ZeroPageInjector(spec), run)
    after = snapshot(run)
    name = "checkpoints/step-00000030/state.pt"
    assert changed(before, after) == {name}
    old, new = before[name], after[name]
    assert old is not None and new is not None and len(old) == len(new)
    start = rec.details["offset"]
    end = start + rec.details["length"]
    assert start % 4096 == 0 and (offset is None or start == offset)
    assert rec.details["length"] == min(4096, len(old) - start)
    assert new[start:end] == bytes(end - start)
    assert new[:start] == old[:start] and new[end:] == old[end:]


def test_delete_file_and_manifest(run: Path) -> None:
    before = snapshot(run)
    spec = DeleteFileSpec(at_step=1, checkpoint="step-00000010", file="rng-rank-*.pt")
    assert len(damage(DeleteFileInjector(spec), run)) == 2
    damage(DeleteManifestInjector(DeleteManifestSpec(at_step=1)), run)
    gone = {f"checkpoints/step-00000010/rng-rank-{r}.pt" for r in (0, 1)}
    gone.add("checkpoints/step-00000030/manifest.json")
    assert changed(before, snapshot(run)) == gone
    assert all(not (run / name).exists() for name in gone)


def test_delete_manifest_twice_is_an_error_that_changes_nothing(run: Path) -> None:
    injector = DeleteManifestInjector(DeleteManifestSpec(at_step=1))
    damage(injector, run)
    before = snapshot(run)
    with pytest.raises(InjectionError, match=r"manifest\.json"):
        damage(injector, run)
    assert snapshot(run) == before


def test_stale_latest_points_at_the_previous_checkpoint(run: Path) -> None:
    before = snapshot(run)
    [rec] = damage(StaleLatestInjector(StaleLatestSpec(at_step=1)), run)
    assert (run / "checkpoints" / "latest").read_text() == "step-00000020\n"
    assert changed(before, snapshot(run)) == {"checkpoints/latest"}
    assert rec.details["latest_before"] == "step-00000030"
    assert rec.details["latest_after"] == "step-00000020"


def test_stale_latest_partial_is_a_broken_copy_at_the_next_step(run: Path) -> None:
    before = snapshot(run)
    damage(StaleLatestInjector(StaleLatestSpec(at_step=1, to="partial")), run)
    partial = ckpt(run, 31)
    assert (run / "checkpoints" / "latest").read_text() == "step-00000031\n"
    assert sorted(p.name for p in partial.iterdir()) == [
        "rng-rank-0.pt",
        "rng-rank-1.pt",
        "state.pt",
    ]
    full = (ckpt(run, 30) / "state.pt").read_bytes()
    assert (partial / "state.pt").read_bytes() == full[: len(full) // 2]
    assert (partial / "rng-rank-1.pt").read_bytes() == (
        ckpt(run, 30) / "rng-rank-1.pt"
    ).read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - torch raises several kinds here
        torch.load(partial / "state.pt", weights_only=True)
    after = snapshot(run)
    assert {k for k in changed(before, after) if not k.startswith("checkpoints/step-00000031")} == {
        "checkpoints/latest"
    }


def test_stale_latest_without_a_previous_checkpoint_fails(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(10,))
    before = snapshot(run)
    with pytest.raises(InjectionError, match="no checkpoint older than step-00000010"):
        damage(StaleLatestInjector(StaleLatestSpec(at_step=1)), run)
    assert snapshot(run) == before


@pytest.mark.parametrize(("source", "step"), [("previous", 20), ("step-00000010", 10)])
def test_swap_copies_the_other_checkpoints_file(run: Path, source: str, step: int) -> None:
    before = snapshot(run)
    [rec] = damage(SwapInjector(SwapSpec(at_step=1, source=source)), run)
    other = (ckpt(run, step) / "state.pt").read_bytes()
    assert (ckpt(run, 30) / "state.pt").read_bytes() == other
    assert changed(before, snapshot(run)) == {"checkpoints/step-00000030/state.pt"}
    assert rec.details["source"] == str(ckpt(run, step) / "state.pt")
    assert torch.load(ckpt(run, 30) / "state.pt", weights_only=True)["step"] == step


def test_foreign_directory_without_latest_uses_the_newest(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", root="ckpts")
    (run / "ckpts" / "latest").unlink()
    spec = DeleteFileSpec(at_step=1, directory="ckpts", file="manifest.json")
    [rec] = damage(DeleteFileInjector(spec), run)
    assert rec.target == str(run / "ckpts" / "step-00000030" / "manifest.json")
    spec = DeleteFileSpec(at_step=1, directory=str(run / "ckpts"), checkpoint="previous")
    DeleteFileInjector(spec).apply(None)  # an absolute directory needs no run directory
    assert not (run / "ckpts" / "step-00000020" / "state.pt").exists()


def test_end_step_applies_to_the_context_checkpoint_folder(run: Path) -> None:
    injector = build_injector(parse_fault({"kind": "truncate", "at_step": 3}))
    folder = str(RunLayout(run).checkpoints)
    ctx = StepContext(step=3, rank=0, world_size=1, run_dir=str(run), checkpoints=folder)
    [rec] = injector.end_step(ctx)
    assert rec.details["size_after"] == rec.details["size_before"] // 2
    with pytest.raises(InjectionError, match="run directory"):
        injector.end_step(StepContext(step=3, rank=0, world_size=1))


MISSING: list[tuple[dict[str, Any], str]] = [
    ({"kind": "bitflip_file", "checkpoint": "step-00000099"}, "step-00000099"),
    ({"kind": "truncate", "file": "optimizer.pt"}, "optimizer.pt"),
    ({"kind": "zero_page", "directory": "elsewhere"}, "elsewhere"),
    ({"kind": "zero_page", "offset": 1 << 20}, "past the end"),
    ({"kind": "bitflip_file", "offset": 1 << 20}, "past the end"),
    ({"kind": "swap", "source": "latest"}, "nothing to swap"),
    ({"kind": "swap", "file": "*.pt", "source": "step-00000010"}, "nothing to swap"),
    ({"kind": "stale_latest", "to": "partial"}, "step-00000031"),
]


@pytest.mark.parametrize(("fault", "missing"), MISSING)
def test_missing_target_raises_and_changes_nothing(
    run: Path, fault: dict[str, Any], missing: str
) -> None:
    (ckpt(run, 10) / "rng-rank-1.pt").unlink()  # the swap source lacks one file
    ckpt(run, 31).mkdir()  # the partial's name is taken
    before = snapshot(run)
    with pytest.raises(InjectionError, match=missing):
        folder = str(RunLayout(run).checkpoints)
        build_injector(parse_fault(fault | {"at_step": 1})).end_step(
            StepContext(step=1, rank=0, world_size=1, run_dir=str(run), checkpoints=folder)
        )
    assert snapshot(run) == before


def test_no_checkpoint_at_all(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    with pytest.raises(InjectionError, match="no checkpoint in"):
        damage(DeleteFileInjector(DeleteFileSpec(at_step=1, file="*")), run)
    (run / "checkpoints" / "latest").write_text("step-00000030\n")
    with pytest.raises(InjectionError, match="names 'step-00000030'"):
        damage(DeleteFileInjector(DeleteFileSpec(at_step=1, file="*")), run)
    assert snapshot(run) == {"checkpoints": None, "checkpoints/latest": b"step-00000030\n"}


@pytest.mark.parametrize(
    ("fault", "field"),
    [
        ({"kind": "truncate", "keep_fraction": 1.5}, "keep_fraction"),
        ({"kind": "truncate", "keep_fraction": 1.0}, "keep_fraction"),
        ({"kind": "bitflip_file", "bit": 8}, "bit"),
        ({"kind": "swap", "checkpoint": "newest"}, "checkpoint"),
        ({"kind": "delete_manifest", "file": "state.pt"}, "file"),
        ({"kind": "stale_latest", "to": "nowhere"}, "to"),
        ({"kind": "stale_latest", "file": "state.pt"}, "file"),
        ({"kind": "zero_page", "page_size": 0}, "page_size"),
        ({"kind": "delete_file", "colour": "red"}, "colour"),
    ],
)
def test_bad_specs_name_the_field(fault: dict[str, Any], field: str) -> None:
    with pytest.raises(FaultSpecError, match=rf"plan\.faults\[0\]\.{field}:"):
        parse_fault(fault | {"at_step": 1}, "plan.faults[0]")


def test_kinds_are_registered_with_rank_zero_by_default() -> None:
    names = ("bitflip_file", "truncate", "zero_page", "delete_file", "delete_manifest")
    for name in (*names, "stale_latest", "swap"):
        kind = kinds()[name]
        assert kind.spec.fault_class == "checkpoint" and kind.spec.description
        spec = parse_fault({"kind": name, "at_step": 1})
        assert spec.ranks == [0] and spec.target_ranks(4) == {0}
    with pytest.raises(FaultSpecError, match="offset 100 is no multiple of page_size 4096"):
        parse_fault({"kind": "zero_page", "at_step": 1, "offset": 100}, "plan.faults[0]")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"file": "../../../../root/.ssh/*"}, "file"),
        ({"file": "/etc/passwd"}, "file"),
        ({"path": "../outside.pt"}, "path"),
        ({"directory": "../elsewhere"}, "directory"),
    ],
)
def test_a_fault_path_that_leaves_the_run_is_refused(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(FaultSpecError, match=rf"{named} .* must stay inside"):
        parse_fault({"kind": "bitflip_file", "at_step": 1, **fields})


def test_a_symlink_out_of_the_run_is_refused_and_the_target_untouched(
    run: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "precious.bin"
    outside.write_bytes(b"keep me" * 100)
    link = ckpt(run, 30) / "state.pt"
    link.unlink()
    link.symlink_to(outside)
    spec = BitflipFileSpec(at_step=1)
    with pytest.raises(InjectionError, match=r"file: .* outside .*; refused"):
        damage(BitflipFileInjector(spec), run)
    assert outside.read_bytes() == b"keep me" * 100
    # The trainer's own files (path:) are held to its working directory the same way.
    (run / "snap.pt").symlink_to(outside)
    own = BitflipFileInjector(BitflipFileSpec(at_step=1, path="snap.pt"))
    with pytest.raises(InjectionError, match=r"path: .* outside"):
        own.apply(run, cwd=str(run))
    assert outside.read_bytes() == b"keep me" * 100


def test_the_checkpoint_folder_comes_from_the_harness(run: Path) -> None:
    before = snapshot(run)
    with pytest.raises(InjectionError, match="needs the run's checkpoint folder"):
        TruncateInjector(TruncateSpec(at_step=1)).apply(run)
    assert snapshot(run) == before
