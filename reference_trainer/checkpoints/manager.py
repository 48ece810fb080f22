"""Deciding, writing and verifying checkpoints: full or delta, in the background, with a
manifest, and a loader that refuses damaged checkpoints and falls back to older ones.

Every ``full_every``-th checkpoint is full (``state.pt``); those in between are deltas
(``delta.bin``) against the last full one. A save stalls the loop only to copy the state
to CPU memory and write this rank's RNG file; rank 0 persists the rest in a background
thread. Until the directory is renamed into place and ``latest`` rewritten, nothing on
disk looks like a checkpoint, so a crash mid-persist leaves the previous one in charge.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from faults.checkpoint_tree import DELTA_FILE
from harness.records.events import CheckpointRejected, CheckpointSaved
from harness.run_layout import RunLayout
from reference_trainer.checkpoints import files
from reference_trainer.checkpoints.delta import DeltaBlob, DeltaError, decode_delta, encode_delta
from reference_trainer.checkpoints.manifest import (
    MANIFEST,
    check_identity,
    describe_tensors,
    file_digest,
    read_manifest,
    verify_files,
    verify_tensors,
    write_manifest,
)
from reference_trainer.checkpoints.storage import save_failed, state_bytes
from reference_trainer.errors import CheckpointError, ConfigError, SaveError
from reference_trainer.nested import map_leaves

#: The agent's ``claim(claim, step=None)``.
Claim = Callable[..., None]


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How checkpoints are written and trusted."""

    integrity: bool = True
    """Verify every load against the manifest; fall back to an older valid checkpoint."""
    delta: bool = True
    """Write deltas between full checkpoints."""
    full_every: int = 4
    """Every this many checkpoints one is full (the others are deltas)."""
    asynchronous: bool = True
    """Persist in a background thread; the loop only waits for the copy to CPU memory."""
    zstd_level: int = 3

    def __post_init__(self) -> None:
        if self.full_every < 1:
            raise ConfigError(
                f"stability.checkpoints.full_every must be >= 1, got {self.full_every}"
            )
        if not 1 <= self.zstd_level <= 22:
            raise ConfigError(
                f"stability.checkpoints.zstd_level must be in 1..22, got {self.zstd_level}"
            )


def snapshot(state: Any) -> Any:
    """A deep copy with every tensor cloned to CPU memory (the loop may go on at once)."""
    return map_leaves(state, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))


class CheckpointManager:
    """Saves and loads one run's checkpoints; every rank has one, rank 0 writes state."""

    def __init__(
        self,
        run_dir: Path,
        config: CheckpointConfig,
        *,
        rank: int,
        keep: int,
        barrier: Callable[[], None],
        claim: Claim,
        keep_back: int = 0,
        agree: Callable[[int], tuple[int, int]] = lambda step: (step, step),
    ) -> None:
        self.run_dir = run_dir
        #: The smallest and largest of a step over every rank (`load_valid` agrees on one).
        self.agree = agree
        self.root = RunLayout(run_dir).checkpoints
        self.config = config
        self.rank = rank
        self.keep = keep
        #: Also keep the newest checkpoint at least this many steps before the newest one
        #: (the fp32 retry of level-3 recovery rolls back that far).
        self.keep_back = keep_back
        self.barrier = barrier
        self.claim = claim
        self.last_verified: Path | None = None
        self._base: tuple[str, Any] | None = None  # (name, state) of the last full save
        self._since_full = 0
        #: (checkpoint, this rank's RNG states) read with the last verified load.
        self._rng: tuple[Path, dict[str, Any] | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._run_id: str | None = None

    @property
    def run_id(self) -> str:
        """The run's id, bound into every manifest (read once, when first needed)."""
        if self._run_id is None:
            self._run_id = files.read_run_id(self.run_dir)
        return self._run_id

    # -- saving ----------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any] | None) -> None:
        """Checkpoint ``step``: every rank calls this; rank 0 passes the shared state."""
        self.wait()
        t0 = time.perf_counter()
        final = self.root / files.checkpoint_name(step)
        tmp = self.root / f".{final.name}.tmp"
        rng = files.rng_state()
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            files.save_file(rng, tmp / files.rng_file(self.rank))
        except (OSError, RuntimeError) as exc:
            raise save_failed(exc, tmp / files.rng_file(self.rank), state_bytes(rng), step) from exc
        self.barrier()
        if self.rank != 0:
            return
        if state is None:
            raise ValueError("rank 0 must pass the checkpoint state")
        copy = snapshot(state)
        stall = time.perf_counter() - t0
        if self.config.asynchronous:
            self._thread = threading.Thread(
                target=self._persist_guarded,
                args=(step, copy, tmp, final, stall),
                name=f"checkpoint-{step}",
                daemon=False,
            )
            self._thread.start()
        else:
            self._persist(step, copy, tmp, final, stall)

    def wait(self) -> None:
        """Block until the background save (if any) is on disk; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, SaveError):  # already in words (disk full, file too large)
                raise SaveError(f"background save failed: {error}") from error
            raise SaveError(
                f"background checkpoint save failed: {type(error).__name__}: {error}"
            ) from error

    def _persist_guarded(self, *args: Any) -> None:
        try:
            self._persist(*args)
        except BaseException as exc:  # surfaced on the main thread by wait()
            self._error = exc

    def _persist(self, step: int, state: Any, tmp: Path, final: Path, stall: float) -> None:
        t0 = time.perf_counter()
        full = (
            not self.config.delta
            or self._base is None
            or self._since_full + 1 >= self.config.full_every
        )
        writing, needed = tmp / files.STATE_FILE, state_bytes(state)
        try:
            if full:
                files.save_file(state, writing)
                parent = None
            else:
                assert self._base is not None
                parent, base_state = self._base
                data = encode_delta(state, base_state, level=self.config.zstd_level).to_bytes()
                writing, needed = tmp / DELTA_FILE, len(data)
                _write_bytes(writing, data)
            writing, needed = tmp / MANIFEST, 1 << 16
            write_manifest(
                tmp,
                run_id=self.run_id,
                step=step,
                kind="full" if full else "delta",
                parent=parent,
                tensors=describe_tensors(state),
            )
            writing = final
            files.publish(tmp, final)
        except (OSError, RuntimeError) as exc:
            raise save_failed(exc, writing, needed, step) from exc
        # Read back what landed before calling it good: a write can fail silently.
        verify_files(final, read_manifest(final))
        self.last_verified = final
        if full:
            self._base, self._since_full = (final.name, state), 0
        else:
            self._since_full += 1
        size = sum(p.stat().st_size for p in final.iterdir())
        saved = CheckpointSaved(
            path=str(final),
            bytes=size,
            type="full" if full else "delta",
            seconds=time.perf_counter() - t0,
            stall_seconds=stall,
            # Names these weights for whoever later reads them back (the collapse check).
            manifest_sha256=file_digest(final / MANIFEST),
        )
        self.claim(saved, step=step)
        self.prune()

    def prune(self) -> list[Path]:
        """Keep the newest ``keep`` checkpoints, every one from the newest at least
        ``keep_back`` steps older than the newest checkpoint on, the full ones their deltas
        need, and the newest verified one; delete the rest. Only this run's own checkpoints count or
        go: a directory whose manifest is not this run's at its name's step is left be."""
        own = {p: self._own_manifest(p) for p in files.complete_checkpoints(self.run_dir)}
        done = [p for p, manifest in own.items() if manifest is not None]
        keep = set(done[-self.keep :])
        if self.keep_back and done:
            # Everything from the newest checkpoint at least keep_back steps old onwards:
            # the younger ones become that checkpoint as training moves on.
            floor = files.checkpoint_step(done[-1]) - self.keep_back
            far = [p for p in done if files.checkpoint_step(p) <= floor]
            keep.update(p for p in done if not far or p >= far[-1])
        for path in list(keep):
            manifest = own[path]
            if manifest is not None and manifest["parent"] is not None:
                keep.add(self.root / manifest["parent"])
        if self.last_verified is not None:
            keep.add(self.last_verified)
        removed = [p for p in done if p not in keep]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    # -- loading ---------------------------------------------------------------------

    def candidates(self) -> list[Path]:
        """Checkpoints to try, newest first. Without integrity checks, the one ``latest``
        names (or the newest by name) alone."""
        if not self.config.integrity:
            latest = files.latest_checkpoint(self.run_dir)
            return [latest] if latest else []
        return list(reversed(files.complete_checkpoints(self.run_dir)))

    def load(self, path: Path) -> dict[str, Any]:
        """The full state of one checkpoint, verified against its manifest when asked."""
        return self._read(path, verify=self.config.integrity)

    def _checked(self, path: Path) -> dict[str, Any]:
        manifest = read_manifest(path)
        check_identity(path, manifest, self.run_id)
        verify_files(path, manifest)
        return manifest

    def _parent_of(self, path: Path, manifest: dict[str, Any]) -> Path:
        """A delta's parent, named by its manifest: a checkpoint of an earlier step."""
        parent = self.root / str(manifest["parent"])
        if files.checkpoint_step(parent) >= manifest["step"]:
            raise CheckpointError(f"{path}: its parent {parent.name} is not an earlier step")
        return parent

    def _checked_parent(self, path: Path, manifest: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
        """A delta's parent and its manifest once it has passed `_checked` and proved full
        (so a chain is one link long and cannot loop)."""
        parent = self._parent_of(path, manifest)
        parent_manifest = self._checked(parent)
        if parent_manifest["kind"] != "full":
            raise CheckpointError(f"{path}: its parent {parent.name} is not full")
        return parent, parent_manifest

    def _read(self, path: Path, *, verify: bool) -> dict[str, Any]:
        if verify:
            manifest: dict[str, Any] | None = self._checked(path)
        else:
            manifest = read_manifest(path) if (path / DELTA_FILE).exists() else None

        # Verified, every file is hashed again as it is read: a file changed between the
        # manifest check and the read (another rank's fault, a disk) is refused.
        def digest(of: dict[str, Any] | None, name: str) -> str | None:
            return str(of["files"][name]["sha256"]) if verify and of is not None else None

        if manifest is not None and manifest["kind"] == "delta":
            if verify:
                parent, base_manifest = self._checked_parent(path, manifest)
                base_file = parent / files.STATE_FILE
                base = files.load_file(base_file, digest(base_manifest, files.STATE_FILE))
                verify_tensors(parent, base_manifest, base)
            else:
                base = files.load_file(self._parent_of(path, manifest) / files.STATE_FILE)
            try:
                data = (path / DELTA_FILE).read_bytes()
                expected = digest(manifest, DELTA_FILE)
                if expected is not None and hashlib.sha256(data).hexdigest() != expected:
                    raise DeltaError("changed after it was verified (its hash differs as read)")
                state: dict[str, Any] = decode_delta(DeltaBlob.from_bytes(data), base)
            except (DeltaError, OSError) as exc:
                raise CheckpointError(f"{path / DELTA_FILE}: {exc}") from exc
        else:
            state = files.load_file(path / files.STATE_FILE, digest(manifest, files.STATE_FILE))
        if verify:
            assert manifest is not None
            verify_tensors(path, manifest, state)
            # This rank's RNG states, read and hashed now with the rest (`rng_of`).
            name, rng = files.rng_file(self.rank), None
            if name in manifest["files"]:
                rng = files.load_file(path / name, digest(manifest, name))
            self._rng = (path, rng)
        return state

    def rng_of(self, path: Path) -> dict[str, Any] | None:
        """This rank's RNG states of checkpoint ``path``: those read and verified with its
        state when it was loaded verified, else read from disk now; None when this rank
        did not exist when it was taken."""
        if self._rng is not None and self._rng[0] == path:
            return self._rng[1]
        return files.load_rng(path, self.rank)

    def load_valid(
        self, *, skip: int = 0, at_most_step: int | None = None
    ) -> tuple[Path, dict[str, Any]]:
        """The newest checkpoint that loads and verifies, passing over ``skip`` valid ones
        and any newer than ``at_most_step``; every refusal is journaled.

        Every rank ends on the same one: a rank that found a newer checkpoint than another
        rank could verify loads again at or before the oldest found (a file one rank
        verified can be damaged before another reads it)."""
        path, state = self._newest_valid(skip=skip, at_most_step=at_most_step)
        while True:
            low, high = self.agree(files.checkpoint_step(path))
            if low == high:
                return path, state
            path, state = self._newest_valid(at_most_step=low)

    def _newest_valid(
        self, *, skip: int = 0, at_most_step: int | None = None
    ) -> tuple[Path, dict[str, Any]]:
        self.wait()
        rejected = []
        for path in self.candidates():
            if at_most_step is not None and files.checkpoint_step(path) > at_most_step:
                continue
            try:
                state = self.load(path)
            except CheckpointError as exc:
                rejected.append(f"{path.name}: {exc}")
                self.claim(CheckpointRejected(path=str(path), reason=str(exc)))
                continue
            if skip:
                skip -= 1
                continue
            self._note_loaded(path, state)
            return path, state
        detail = "; ".join(rejected) if rejected else "none found"
        raise CheckpointError(f"no valid checkpoint in {self.root} ({detail})")

    def _own_manifest(self, path: Path) -> dict[str, Any] | None:
        """The manifest of ``path`` when it is this run's checkpoint at its name's step,
        else None (its files are not read)."""
        try:
            manifest = read_manifest(path)
            check_identity(path, manifest, self.run_id)
        except CheckpointError:
            return None
        return manifest

    def _note_loaded(self, path: Path, state: dict[str, Any]) -> None:
        self.last_verified = path if self.config.integrity else None
        try:
            full = read_manifest(path)["kind"] == "full"
        except CheckpointError:  # (loaded unverified: integrity checks are off)
            full = False
        if full:
            # A private copy: the optimizer adopts the loaded tensors and updates them in
            # place, which would silently change the base later deltas are encoded against.
            self._base, self._since_full = (path.name, snapshot(state)), 0
        else:  # the next save is full: a delta's base must be one this process verified
            self._base, self._since_full = None, 0


def _write_bytes(path: Path, data: bytes) -> None:
    import os

    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
