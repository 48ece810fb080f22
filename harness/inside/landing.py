"""Saves made in memory, and the files their bytes land in.

Lightning and others ``torch.save`` into a ``BytesIO`` and then write its bytes through
fsspec or ``open`` (to a temporary file, then renamed): the save itself names no file.
The bytes are remembered (SHA-256 and size); from then on a Python audit hook notes every
file opened for writing and every rename's or copy's destination; at the next step
boundary, the noted files that hold exactly those bytes are the save's files.

The audit hook, once added, stays for the process's life (Python has no way to remove
one); with nothing remembered it returns at once.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Step boundaries an in-memory save waits for its bytes to reach a file before it is dropped.
MAX_AGE = 3
#: Written paths remembered at most (a trainer writing many files between two steps).
MAX_WRITTEN = 4096
#: open() flags that write.
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


@dataclass(slots=True)
class MemorySave:
    """One save into memory: its bytes' hash and size, and where they were found since."""

    sha256: str
    size: int
    api: str
    since: int
    age: int = 0
    found: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Landed:
    """A file that holds the bytes of an in-memory save."""

    path: Path
    sha256: str
    size: int
    api: str


class Landing:
    """In-memory saves waiting for their bytes to reach a file (see the module docstring)."""

    def __init__(self) -> None:
        self.pending: list[MemorySave] = []
        self.written: list[str] = []  # absolute paths, in the order first written
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._hooked = False

    def remember(self, data: bytes | memoryview, api: str) -> None:
        """A save wrote ``data`` into memory."""
        sha = hashlib.sha256(data).hexdigest()
        with self._lock:
            self.pending.append(MemorySave(sha, len(data), api, since=len(self.written)))
        if not self._hooked:
            self._hooked = True
            sys.addaudithook(_audit)

    def note(self, path: object) -> None:
        """``path`` is being written (an audit event)."""
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return  # a file descriptor
        where = os.path.abspath(os.fspath(path))
        with self._lock:
            if where not in self._seen and len(self.written) < MAX_WRITTEN:
                self._seen.add(where)
                self.written.append(where)

    def settle(self) -> list[Landed]:
        """The files found to hold a waiting save's bytes since the last call; saves
        waiting longer than `MAX_AGE` boundaries are given up."""
        with self._lock:
            pending, written = list(self.pending), list(self.written)
        landed: list[Landed] = []
        sizes: dict[str, int | None] = {}
        hashes: dict[str, str | None] = {}
        for save in pending:
            for path in written[save.since :]:
                if path in save.found:
                    continue
                if path not in sizes:
                    sizes[path] = _size(path)
                if sizes[path] != save.size:
                    continue
                if path not in hashes:
                    hashes[path] = _sha256(path)
                if hashes[path] == save.sha256:
                    save.found.add(path)
                    file = Landed(Path(path), save.sha256, save.size, save.api)
                    if file not in landed:  # two saves of the same bytes: one file
                        landed.append(file)
            save.age += 1
        with self._lock:
            self.pending = [s for s in self.pending if s.age < MAX_AGE]
            if not self.pending:
                self.written, self._seen = [], set()
        return landed


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size if os.path.isfile(path) else None
    except OSError:
        return None


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


landing = Landing()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Python's audit hook: note files written while an in-memory save waits."""
    if not landing.pending:
        return
    try:
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else False
            if writes or (mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS):
                landing.note(path)
        elif event in ("os.rename", "os.replace", "shutil.copyfile", "shutil.move"):
            landing.note(args[1])
    except Exception:  # an audit hook that raises would break the trainer's own call
        return
