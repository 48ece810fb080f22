"""Observed checkpoints: every file the trainer saves or loads, seen by the agent itself.

While an agent is attached, ``torch.save`` / ``torch.load``, safetensors' ``save_file`` /
``load_file`` (when installed) and ``torch.distributed.checkpoint.save`` / ``load`` (once
the trainer imports it; a checkpoint there is a folder, hashed file by file) are wrapped.
A save of a file (a path, or a file object with a real path) is reported with the SHA-256
of its bytes just after the save; a save into a ``BytesIO``, once its bytes are found in a
file (`harness.inside.landing`, at the next step boundary); a load with the SHA-256 of the
bytes it read, before the load runs; a load that raises with the error. Nothing here
decides anything: `harness.inside.attach` journals the observations and the oracles
compare a load's hash with the hash at its last save.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch

from harness.inside.landing import landing
from harness.records.events import FileSaved
from harness.records.journal import read_journal_file
from harness.run_layout import RunLayout

#: Bytes read at a time while hashing.
_CHUNK = 1 << 20


class FileListener(Protocol):
    """What is told of the trainer's saves and loads."""

    def before_save(self, obj: object) -> Callable[[], None]:
        """A save of ``obj`` begins; returns what to call when it is over."""
        ...

    def saved(self, path: Path, sha256: str, size: int, api: str) -> None:
        """``path`` was written; its bytes hash to ``sha256``."""
        ...

    def loaded(self, path: Path, sha256: str, api: str) -> None:
        """``path`` (whose bytes hash to ``sha256``) was loaded without error."""
        ...

    def load_failed(self, path: Path, sha256: str | None, error: BaseException, api: str) -> None:
        """Loading ``path`` raised ``error``."""
        ...


_listeners: list[FileListener] = []
_originals: dict[tuple[object, str], Callable[..., Any]] = {}


def file_path(f: object) -> Path | None:
    """The absolute path a save or load goes to, when it is a file (or a checkpoint folder)
    on disk: a path, a file object with a name, a DCP storage reader or writer's path."""
    if isinstance(f, (str, os.PathLike)):
        return Path(os.path.abspath(os.fspath(f)))
    storage = getattr(f, "path", None)  # FileSystemReader / FileSystemWriter
    if isinstance(storage, (str, os.PathLike)):
        return Path(os.path.abspath(os.fspath(storage)))
    name = getattr(f, "name", None)
    if isinstance(name, str) and os.path.isfile(name):
        return Path(os.path.abspath(name))
    return None


def digest(path: Path) -> tuple[str, int] | None:
    """(SHA-256, size) of a file's bytes, or of a folder's files (names and bytes, in name
    order); None when it cannot be read."""
    h = hashlib.sha256()
    size = 0
    try:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if file != path:
                h.update(file.relative_to(path).as_posix().encode() + b"\0")
            with open(file, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    size += len(chunk)
    except OSError:
        return None
    return h.hexdigest(), size


#: Keyword names of where a save or load goes, across the wrapped functions.
_WHERE = ("f", "filename", "checkpoint_id", "storage_writer", "storage_reader")


def _where(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> object:
    if len(args) > position:
        return args[position]
    return next((kwargs[k] for k in _WHERE if kwargs.get(k) is not None), None)


def _wrap_save(
    original: Callable[..., Any], api: str, target: int, *, collective: bool = False
) -> Callable[..., Any]:
    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        if not _listeners:
            return original(*args, **kwargs)
        obj = (
            args[0] if args else kwargs.get("obj", kwargs.get("tensors", kwargs.get("state_dict")))
        )
        where = _where(args, kwargs, target)
        afters = [listener.before_save(obj) for listener in tuple(_listeners)]
        start = _position(where)
        try:
            result = original(*args, **kwargs)
        finally:
            for after in afters:
                after()
        path = file_path(where)
        if path is None and start is not None:
            # Into memory (a BytesIO): the file comes later (harness.inside.landing).
            landing.remember(where.getbuffer()[start : where.tell()], api)  # type: ignore[attr-defined]
        if path is not None:
            flush = getattr(where, "flush", None)
            if callable(flush):
                flush()
            found = digest(path)
            if found is not None:
                for listener in tuple(_listeners):
                    listener.saved(path, found[0], found[1], api)
            if collective:
                # Every rank hashes the whole folder, the other ranks' streams included: none
                # may go on (an after_save fault damages the folder when its next step
                # begins) before all have hashed what the save wrote.
                _barrier(kwargs.get("process_group"))
        return result

    return save


def _barrier(group: Any) -> None:
    """Wait for the ranks of ``group`` (the default one when None), when several train."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group)


def _position(where: object) -> int | None:
    """Where a save into an in-memory buffer (``BytesIO``) starts; None for anything else."""
    if isinstance(where, io.BytesIO):
        return where.tell()
    return None


def settle_memory_saves() -> None:
    """Tell the listeners of the files that now hold the bytes of earlier in-memory saves."""
    if not landing.pending:
        return
    for landed in landing.settle():
        for listener in tuple(_listeners):
            listener.saved(landed.path, landed.sha256, landed.size, landed.api)


def _wrap_load(original: Callable[..., Any], api: str, target: int = 0) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        if not _listeners:
            return original(*args, **kwargs)
        where = _where(args, kwargs, target)
        path = file_path(where)
        found = digest(path) if path is not None else None
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            if path is not None:
                for listener in tuple(_listeners):
                    listener.load_failed(path, found[0] if found else None, exc, api)
            raise
        if path is not None and found is not None:
            for listener in tuple(_listeners):
                listener.loaded(path, found[0], api)
        return result

    return load


def _patch(owner: object, name: str, wrapper: Callable[..., Any]) -> None:
    if (owner, name) not in _originals:
        _originals[(owner, name)] = getattr(owner, name)
        setattr(owner, name, wrapper)


def install_wrappers() -> None:
    """Wrap the save and load functions (once; they pass straight through with no listener)."""
    import torch.serialization as serialization

    save = _wrap_save(serialization.save, "torch.save", 1)
    load = _wrap_load(serialization.load, "torch.load")
    for owner in (torch, serialization):
        _patch(owner, "save", save)
        _patch(owner, "load", load)
    if importlib.util.find_spec("safetensors") is not None:
        import safetensors.torch as st  # type: ignore[import-not-found,unused-ignore]

        _patch(st, "save_file", _wrap_save(st.save_file, "safetensors.save_file", 1))
        _patch(st, "load_file", _wrap_load(st.load_file, "safetensors.load_file"))
    # Importing torch.distributed.checkpoint costs start-up time: wrap it once the trainer
    # imports it (its positional argument is the state dict; where is a keyword).
    if DCP in sys.modules:
        _patch_dcp()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(DCP, _patch_dcp))


DCP = "torch.distributed.checkpoint"


def _patch_dcp() -> None:
    dcp = sys.modules[DCP]
    _patch(dcp, "save", _wrap_save(dcp.save, "torch.distributed.checkpoint.save", 1,
                                   collective=True))  # fmt: skip
    _patch(dcp, "load", _wrap_load(dcp.load, "torch.distributed.checkpoint.load", 1))


class _AfterImport(MetaPathFinder):
    """Finds nothing itself; runs ``then`` once the module ``name`` has been imported."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            self.then()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def add_file_listener(listener: FileListener) -> None:
    """Tell ``listener`` of every file saved or loaded from now on."""
    install_wrappers()
    if listener not in _listeners:
        _listeners.append(listener)


def remove_file_listener(listener: FileListener) -> None:
    """Stop telling ``listener``; the wrappers stay and pass straight through."""
    if listener in _listeners:
        _listeners.remove(listener)


# -- a load against the run's saves --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SavedFile:
    """One observed save: when, where, the bytes' hash, the step."""

    wall: float
    path: str
    sha256: str
    step: int


@dataclass(frozen=True, slots=True)
class SaveMatch:
    """A load compared with the saves: intact when its bytes are those of a save (of this
    file, or of one renamed since, like ``snapshot.pt.prev``); not intact when the run saved
    this file but never these bytes; unknown (None) for a file the run never saved."""

    intact: bool | None
    sha256: str | None = None
    step: int | None = None

    @classmethod
    def of(cls, saves: list[SavedFile], path: str, sha256: str) -> SaveMatch:
        """The match of ``path`` with bytes ``sha256`` among ``saves``."""
        same = sorted((s for s in saves if s.sha256 == sha256), key=lambda s: s.wall)
        if same:
            return cls(True, same[-1].sha256, same[-1].step)
        here = sorted((s for s in saves if s.path == path), key=lambda s: s.wall)
        if here:
            return cls(False, here[-1].sha256, here[-1].step)
        return cls(None)

    def fields(self) -> dict[str, Any]:
        """The `file_loaded` fields."""
        return {"saved_sha256": self.sha256, "saved_step": self.step, "intact": self.intact}


def read_saves(run_dir: Path) -> list[SavedFile]:
    """Every ``file_saved`` in the run's journals."""
    folder = RunLayout(run_dir).journal
    saves = []
    for path in sorted(folder.glob("rank-*.jsonl")) if folder.is_dir() else []:
        for event in read_journal_file(path, warn=False):
            where, sha = event.get("path"), event.get("sha256")
            if event.is_(FileSaved) and isinstance(where, str) and isinstance(sha, str):
                saves.append(SavedFile(event.wall, where, sha, event.step))
    return saves
