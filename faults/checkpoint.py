"""Checkpoint faults: damage saved checkpoint files on disk, as a bad disk or a crash would.

The layout is the reference trainer's (a foreign trainer with the same shape passes
``directory``)::

    ROOT/step-00000040/state.pt, rng-rank-R.pt, manifest.json
    ROOT/latest          the text "step-00000040\\n"
    ROOT/.step-N.tmp/    a save in progress: never a target

ROOT is the run's checkpoint folder, which the harness passes in the step context
(``RUN_DIR/checkpoints``), unless ``directory`` names another folder (a relative one is
taken relative to RUN_DIR). ``checkpoint`` picks the victim: ``latest`` (the folder
``latest`` names; without that file, the newest ``step-*`` folder), ``previous`` (the
newest checkpoint older than latest) or an explicit name such as ``step-00000040``.

A trainer with files of its own (``snapshot.pt``, ``ckpt/epoch-3.pt``) is reached with
``path``: a glob relative to the trainer's working directory. With ``after_save: true``
the fault waits, from its trigger step on, for the trainer to save a matching file (as
the agent observes saves) and damages that file when the next step begins.

Every injector has ``apply(run_dir, cwd, checkpoints)`` for direct use; ``end_step`` calls
it, and the agent calls ``end_step`` after the step's checkpoint save. Every target is
checked before the first byte is written, so an `InjectionError` leaves the tree as it was.
Writes are real: opened ``r+b``, written, flushed and fsynced.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import Field, model_validator

from faults.bias import Bias
from faults.checkpoint_files import (
    DATA,
    contained,
    fsync,
    latest_checkpoint,
    previous_checkpoint,
    resolve_checkpoint,
    step_of,
    write_at,
    write_latest,
)
from faults.checkpoint_tree import DELTA_FILE, LATEST, MANIFEST, STATE_FILE, WHICH
from faults.errors import InjectionError, NothingToDamage
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec, seeded


class CheckpointFaultSpec(FaultSpec):
    """Fields every checkpoint kind shares: where the checkpoints live, which rank acts."""

    fault_class: ClassVar[FaultClass] = "checkpoint"

    directory: str | None = Field(
        default=None,
        min_length=1,
        description="Default: RUN_DIR/checkpoints; relative to RUN_DIR, and inside it.",
    )

    @model_validator(mode="after")
    def _directory_inside(self) -> CheckpointFaultSpec:
        if self.directory is not None and ".." in Path(self.directory).parts:
            raise ValueError(f"directory {self.directory!r} must stay inside the run dir (no '..')")
        return self

    ranks: list[int] | Literal["all", "random"] = Field(
        default=[0], description="Ranks that damage files."
    )


def _relative(field: str, value: str, inside: str) -> None:
    """Refuse a glob that could leave ``inside``: absolute, or with a '..' part."""
    if Path(value).is_absolute() or ".." in Path(value).parts:
        raise ValueError(f"{field} {value!r} must stay inside {inside} (relative, no '..')")


class CheckpointFileSpec(CheckpointFaultSpec):
    """Fields of the kinds that damage files inside one checkpoint."""

    checkpoint: Annotated[str, Bias(("latest", "previous"), only=True)] = Field(
        default="latest", pattern=WHICH, description="latest, previous, step-NNNNNNNN."
    )
    file: Annotated[str, Bias(("data", "*", "manifest.json"), only=True)] = Field(
        default=DATA,
        min_length=1,
        description="Glob of the files damaged (all of them), or `data`: the checkpoint's "
        "data file, state.pt or, in a delta checkpoint, delta.bin.",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        description="Instead of checkpoint and file: a glob of the trainer's own files, "
        "relative to its working directory (e.g. 'snapshot.pt').",
    )
    after_save: bool = Field(
        default=False,
        description="With path: from the trigger step on, wait for the trainer to save a "
        "matching file and damage it right after that save.",
    )

    @model_validator(mode="after")
    def _path_inside(self) -> CheckpointFileSpec:
        _relative("file", self.file, "the checkpoint")
        if self.path is not None:
            _relative("path", self.path, "the trainer's working directory")
            if self.directory is not None:
                raise ValueError("give path or directory, not both")
        elif self.after_save:
            raise ValueError("after_save needs path: the file whose save it waits for")
        return self


def checkpoints_root(
    spec: CheckpointFaultSpec, run_dir: str | Path | None, checkpoints: str | Path | None
) -> Path:
    """The folder holding the checkpoints, which must exist: ``directory`` when the spec
    names one, else the run's checkpoint folder as the harness passed it."""
    if spec.directory is not None and Path(spec.directory).is_absolute():
        root = Path(spec.directory)
    elif run_dir is None:
        raise InjectionError(f"{spec.kind} needs the run directory; attach the agent with one")
    elif spec.directory is not None:
        root = Path(run_dir) / spec.directory
    elif checkpoints is None:
        raise InjectionError(f"{spec.kind} needs the run's checkpoint folder; none was given")
    else:
        root = Path(checkpoints)
    if not root.is_dir():
        raise NothingToDamage(f"checkpoint directory {root} does not exist")
    if run_dir is not None:
        contained(root, [Path(run_dir)], "directory")
    return root


S = TypeVar("S", bound=CheckpointFaultSpec)
F = TypeVar("F", bound=CheckpointFileSpec)


class CheckpointInjector(Injector[S]):
    """Base: ``end_step`` applies the damage to the run's checkpoints."""

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Damage the checkpoint the step's save left behind."""
        if self.waits_for_save():
            return []
        return self.apply(ctx.run_dir, ctx.cwd, ctx.checkpoints)

    def apply(
        self,
        run_dir: str | Path | None,
        cwd: str | None = None,
        checkpoints: str | Path | None = None,
    ) -> list[Injection]:
        """Damage the checkpoints in ``checkpoints`` (the run's checkpoint folder) of the run
        in ``run_dir``, or the trainer's own files under ``cwd``; one record per file."""
        return self._damage(checkpoints_root(self.spec, run_dir, checkpoints))

    def _damage(self, root: Path) -> list[Injection]:
        raise NotImplementedError


class FileInjector(CheckpointInjector[F]):
    """Base of the kinds that damage each file matching ``file`` in one checkpoint, or each
    of the trainer's own files matching ``path``."""

    def waits_for_save(self) -> bool:
        """True with ``after_save``: the damage follows an observed save."""
        return self.spec.after_save

    def on_file_saved(self, ctx: StepContext, path: str) -> list[Injection]:
        """The trainer saved ``path``: damage it when it matches ``path`` (after_save). A
        save of a folder (a DCP checkpoint, a ``checkpoint-N/``) is one checkpoint: its
        files that match are damaged."""
        root = Path(ctx.cwd or os.getcwd())
        saved = Path(path)
        if not self.spec.after_save or self.spec.path is None:
            return []
        files = sorted(p for p in saved.rglob("*") if p.is_file()) if saved.is_dir() else [saved]
        pattern = self.spec.path
        matching = [
            f for f in files if f.is_relative_to(root) and f.relative_to(root).match(pattern)
        ]
        return self._damage_files(root, root, matching) if matching and saved.exists() else []

    def apply(
        self,
        run_dir: str | Path | None,
        cwd: str | None = None,
        checkpoints: str | Path | None = None,
    ) -> list[Injection]:
        """Damage the matching files: of one checkpoint, or the trainer's own (``path``)."""
        if self.spec.path is None:
            return super().apply(run_dir, cwd, checkpoints)
        root = Path(cwd or os.getcwd())
        files = sorted(p for p in root.glob(self.spec.path) if p.is_file())
        if not files:
            raise NothingToDamage(f"no file matching path {self.spec.path!r} in {root}")
        return self._damage_files(root, root, files)

    def _damage(self, root: Path) -> list[Injection]:
        ckpt = resolve_checkpoint(root, self.spec.checkpoint)
        if self.spec.file == DATA:
            files = [p for p in (ckpt / STATE_FILE, ckpt / DELTA_FILE) if p.is_file()][:1]
        else:
            files = sorted(p for p in ckpt.glob(self.spec.file) if p.is_file())
        if not files:
            raise NothingToDamage(f"no file matching {self.spec.file!r} in {ckpt}")
        return self._damage_files(root, ckpt, files)

    def _damage_files(self, root: Path, ckpt: Path, files: list[Path]) -> list[Injection]:
        field = "path" if self.spec.path is not None else "file"
        files = [contained(path, [root], field) for path in files]
        plans = [(path, self._prepare(root, ckpt, path)) for path in files]  # check all first
        records = []
        for path, plan in plans:
            size = path.stat().st_size
            details = {"checkpoint": ckpt.name, "file": str(path), "size_before": size}
            details |= self._act(path, plan)
            if path.exists():
                details["size_after"] = path.stat().st_size
            records.append(Injection(fault=self.spec.kind, target=str(path), details=details))
        return records

    def _rng_parts(self, ckpt: Path, path: Path) -> tuple[str, str, str]:
        return (self.spec.kind, ckpt.name, path.relative_to(ckpt).as_posix())

    def _prepare(self, root: Path, ckpt: Path, path: Path) -> dict[str, Any]:
        return {}

    def _act(self, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class BitflipFileSpec(CheckpointFileSpec):
    """Flip one bit of each matched file."""

    kind: Literal["bitflip_file"] = "bitflip_file"
    description: ClassVar[str] = "Flip one bit of a checkpoint file (silent disk corruption)."
    offset: int | None = Field(default=None, ge=0, description="Byte to flip; seeded when unset.")
    bit: Annotated[int | None, Bias()] = Field(
        default=None, ge=0, le=7, description="Bit of that byte; seeded when unset."
    )


class BitflipFileInjector(FileInjector[BitflipFileSpec]):
    """Flips exactly one bit per file."""

    def _prepare(self, root: Path, ckpt: Path, path: Path) -> dict[str, Any]:
        size = path.stat().st_size
        if size == 0:
            raise NothingToDamage(f"{path} is empty; there is no bit to flip")
        rng = seeded(self.spec.seed, *self._rng_parts(ckpt, path))
        offset = self.spec.offset if self.spec.offset is not None else rng.randrange(size)
        bit = self.spec.bit if self.spec.bit is not None else rng.randrange(8)
        if offset >= size:
            raise InjectionError(f"offset {offset} is past the end of {path} ({size} bytes)")
        return {"offset": offset, "bit": bit}

    def _act(self, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
        with open(path, "rb") as f:
            f.seek(plan["offset"])
            before = f.read(1)[0]
        after = before ^ (1 << plan["bit"])
        write_at(path, plan["offset"], bytes([after]))
        return plan | {"byte_before": before, "byte_after": after}


class TruncateSpec(CheckpointFileSpec):
    """Cut each matched file short."""

    kind: Literal["truncate"] = "truncate"
    description: ClassVar[str] = "Truncate a checkpoint file (a save cut short)."
    keep_fraction: Annotated[float, Bias((0.0, 0.99))] = Field(
        default=0.5, ge=0, lt=1, description="Share of the file kept."
    )


class TruncateInjector(FileInjector[TruncateSpec]):
    """Keeps ``floor(size * keep_fraction)`` bytes of each file."""

    def _act(self, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
        write_at(path, 0, b"", int(path.stat().st_size * self.spec.keep_fraction))
        return {"keep_fraction": self.spec.keep_fraction}


class ZeroPageSpec(CheckpointFileSpec):
    """Zero one page of each matched file."""

    kind: Literal["zero_page"] = "zero_page"
    description: ClassVar[str] = "Overwrite one page of a checkpoint file with zeros (lost write)."
    page_size: Annotated[int, Bias((4096, 512), only=True)] = Field(
        default=4096, ge=1, description="Bytes in a page."
    )
    offset: Annotated[int | None, Bias((0,), only=True)] = Field(
        default=None, ge=0, description="Page-aligned start; seeded when unset."
    )

    @model_validator(mode="after")
    def _aligned(self) -> ZeroPageSpec:
        if self.offset is not None and self.offset % self.page_size:
            raise ValueError(f"offset {self.offset} is no multiple of page_size {self.page_size}")
        return self


class ZeroPageInjector(FileInjector[ZeroPageSpec]):
    """Writes zeros over one page, or up to the end of the file when that is shorter."""

    def _prepare(self, root: Path, ckpt: Path, path: Path) -> dict[str, Any]:
        size, page = path.stat().st_size, self.spec.page_size
        if size == 0:
            raise NothingToDamage(f"{path} is empty; there is no page to zero")
        rng = seeded(self.spec.seed, *self._rng_parts(ckpt, path))
        offset = self.spec.offset
        if offset is None:
            offset = rng.randrange(math.ceil(size / page)) * page
        if offset >= size:
            raise InjectionError(f"offset {offset} is past the end of {path} ({size} bytes)")
        return {"offset": offset, "length": min(page, size - offset), "page_size": page}

    def _act(self, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
        with open(path, "rb") as f:
            f.seek(plan["offset"])
            nonzero = sum(1 for b in f.read(plan["length"]) if b)
        write_at(path, plan["offset"], bytes(plan["length"]))
        return plan | {"nonzero_bytes_before": nonzero}


class DeleteFileSpec(CheckpointFileSpec):
    """Delete each matched file."""

    kind: Literal["delete_file"] = "delete_file"
    description: ClassVar[str] = "Delete a file from a checkpoint (lost file)."


class _DeleteInjector(FileInjector[F]):
    """Removes each file and fsyncs its folder."""

    def _act(self, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
        path.unlink()
        fsync(path.parent)
        return {"deleted": True}


class DeleteManifestSpec(CheckpointFileSpec):
    """Delete the checkpoint's manifest."""

    kind: Literal["delete_manifest"] = "delete_manifest"
    description: ClassVar[str] = "Delete a checkpoint's manifest.json (unverifiable checkpoint)."
    file: Literal["manifest.json"] = Field(
        default="manifest.json", description="Always manifest.json."
    )


class DeleteFileInjector(_DeleteInjector[DeleteFileSpec]):
    """Deletes every file matching ``file``."""


class DeleteManifestInjector(_DeleteInjector[DeleteManifestSpec]):
    """Deletes ``manifest.json``; an error when the checkpoint has none."""


class SwapSpec(CheckpointFileSpec):
    """Replace each matched file with the same file from another checkpoint."""

    kind: Literal["swap"] = "swap"
    description: ClassVar[str] = "Replace a checkpoint file with its twin from another checkpoint."
    # Unbiased here: a drawn `previous` would be its own twin.
    checkpoint: str = Field(
        default="latest", pattern=WHICH, description="latest, previous, step-NNNNNNNN."
    )
    source: str = Field(
        default="previous", pattern=WHICH, description="Checkpoint the twin comes from."
    )

    @model_validator(mode="after")
    def _checkpoints_only(self) -> SwapSpec:
        if self.path is not None:
            raise ValueError("swap takes its twin from another checkpoint; it has no path form")
        return self


class SwapInjector(FileInjector[SwapSpec]):
    """Overwrites each file in place with the bytes of its twin."""

    def _prepare(self, root: Path, ckpt: Path, path: Path) -> dict[str, Any]:
        other = resolve_checkpoint(root, self.spec.source)
        if other.resolve() == ckpt.resolve():
            raise InjectionError(f"source and checkpoint both name {ckpt}; nothing to swap")
        twin = other / path.relative_to(ckpt)
        if not twin.is_file():
            raise NothingToDamage(f"{twin} does not exist; nothing to swap in for {path.name}")
        return {"source": str(twin)}

    def _act(self, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
        data = Path(plan["source"]).read_bytes()
        write_at(path, 0, data, len(data))
        return plan


class StaleLatestSpec(CheckpointFaultSpec):
    """Make ``latest`` name an older or a partial checkpoint."""

    kind: Literal["stale_latest"] = "stale_latest"
    description: ClassVar[str] = "Point latest at an older checkpoint or at a partial one."
    to: Annotated[Literal["previous", "partial"], Bias()] = Field(
        default="previous",
        description="previous: the last complete older checkpoint; partial: a new half-written "
        "copy of latest (state.pt cut to half, no manifest) at the next step number.",
    )


class StaleLatestInjector(CheckpointInjector[StaleLatestSpec]):
    """Rewrites ``latest`` (atomically, like a real save would)."""

    def _damage(self, root: Path) -> list[Injection]:
        pointer = root / LATEST
        if not pointer.is_file():
            raise NothingToDamage(f"{pointer} does not exist; there is no latest to make stale")
        latest = latest_checkpoint(root)
        details: dict[str, Any] = {"to": self.spec.to, "latest_before": latest.name}
        if self.spec.to == "previous":
            target = previous_checkpoint(root, latest)
        else:
            target = root / f"step-{step_of(latest) + 1:08d}"
            state = latest / STATE_FILE
            if target.exists():
                raise InjectionError(f"{target} already exists; a partial checkpoint needs it free")
            if not state.is_file():
                raise NothingToDamage(f"{state} does not exist; nothing to copy as partial")
            shutil.copytree(latest, target, ignore=shutil.ignore_patterns(MANIFEST))
            size = state.stat().st_size
            write_at(target / STATE_FILE, 0, b"", size // 2)
            for path in [*target.rglob("*"), target, root]:
                fsync(path)
            details |= {"state_size_before": size, "state_size_after": size // 2}
        write_latest(root, target.name)
        details["latest_after"] = target.name
        return [Injection(fault=self.spec.kind, target=str(pointer), details=details)]
