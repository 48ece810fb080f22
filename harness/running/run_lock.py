"""One owner per run directory: an exclusive ``flock`` on ``RUN_DIR/.lock``.

Two trainers on one run dir would share ``.step-N.tmp`` names, append to the same journal
and overwrite each other's checkpoints. So whoever writes a run dir holds its lock for
as long as it lives: the reference trainer (rank 0 of a job; the other ranks write only
after rank 0 has let them through a barrier), ``tightrope exec`` (which keeps it across
its ``exec`` into the user's command), and the suite runner for the run dirs it prepares
and launches trainers into. The kernel releases a ``flock`` when its holder dies, however
it dies, so a SIGKILLed trainer's run dir can be resumed at once; nothing is ever left to
clean up by hand.

The holder writes ``PID HOST`` into the file, so a refusal names it. A holder's own
children share its claim: it puts the same text in their environment (`OWNER_ENV`), and
a process that finds the lock held by the owner its environment names goes on without a
lock of its own (the runner's trainer, a trainer under ``tightrope exec``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import TightropeError
from harness.run_layout import RunLayout

#: The environment variable through which a holder lets its children share its claim.
OWNER_ENV = "TIGHTROPE_RUN_DIR_OWNER"


class RunDirClaimError(TightropeError):
    """The run directory cannot be claimed: another process owns it (holds its lock), or
    it cannot be made."""


def _holder_text() -> str:
    return f"{os.getpid()} {socket.gethostname()}"


class RunDirLock:
    """A claim on one run directory; `acquire` it, `release` it (or let the process end)."""

    def __init__(self, run_dir: Path, fd: int | None, *, before: _Before | None = None) -> None:
        self.run_dir = run_dir
        self._fd = fd
        self._before = before

    @property
    def shared(self) -> bool:
        """True when the claim is an owner's that this process inherited (no lock of its own)."""
        return self._fd is None

    @classmethod
    def acquire(cls, run_dir: Path, *, wait: float = 0.0, inheritable: bool = False) -> RunDirLock:
        """Claim ``run_dir`` (made when missing), or share the claim of the owner named in
        ``OWNER_ENV``; a `RunDirClaimError` naming the holder's pid when another process holds it
        for ``wait`` seconds. ``inheritable`` keeps the lock across an ``exec``."""
        run_dir = Path(run_dir)
        path = RunLayout(run_dir).lock
        before = _Before.of(run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirClaimError(f"cannot make the run dir {run_dir}: {exc.strerror}") from None
        deadline = time.monotonic() + wait
        while True:
            fd = _open(path)
            if _try_lock(fd):
                if _same_file(fd, path):
                    break
                os.close(fd)  # removed by a holder that undid its claim: lock the new file
                continue
            os.close(fd)
            holder = _holder(path)
            if holder and os.environ.get(OWNER_ENV) == holder:
                return cls(run_dir, None)
            if time.monotonic() >= deadline:
                who = f"pid {holder.replace(' ', ' on host ', 1)}" if holder else "another process"
                raise RunDirClaimError(
                    f"run dir {run_dir} is in use by {who} (it holds {path}); wait for it "
                    "to end, or choose another run dir"
                )
            time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, (_holder_text() + "\n").encode())
        os.set_inheritable(fd, inheritable)
        return cls(run_dir, fd, before=before)

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def clear(self) -> None:
        """Empty the run dir for a new run: everything in it but the lock."""
        lock = RunLayout(self.run_dir).lock
        for path in self.run_dir.iterdir():
            if path == lock:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        """The environment entry that lets this process's children share the claim."""
        holder = _holder(RunLayout(self.run_dir).lock) if self.shared else _holder_text()
        return {OWNER_ENV: holder} if holder else {}

    def release(self, *, undo: bool = False) -> None:
        """Give the claim up. With ``undo`` (a refusal: nothing was written), leave the
        disk as acquiring found it when nothing else changed there since: the lock file
        removed or its text put back, the run dir removed when acquiring made it."""
        if self._fd is None:
            return
        before, lock = self._before, RunLayout(self.run_dir).lock
        try:
            if undo and before is not None and before.unchanged(self.run_dir):
                # (Removed while still locked: whoever opened it meanwhile finds that its
                # lock is on a file no longer at the path, and opens it again.)
                if before.lock_text is None:
                    lock.unlink()
                    if not before.existed:
                        self.run_dir.rmdir()
                else:
                    os.ftruncate(self._fd, 0)
                    os.pwrite(self._fd, before.lock_text.encode(), 0)
        except OSError:
            pass  # the claim ends below all the same
        finally:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True, slots=True)
class _Before:
    """What the run dir held before it was claimed, for a claim that is undone."""

    existed: bool
    names: frozenset[str]
    #: The lock file's text, None when there was no lock file.
    lock_text: str | None

    @classmethod
    def of(cls, run_dir: Path) -> _Before:
        try:
            names = frozenset(os.listdir(run_dir))
        except OSError:
            return cls(False, frozenset(), None)
        lock = RunLayout(run_dir).lock
        try:
            text: str | None = lock.read_text() if lock.name in names else None
        except OSError:
            text = ""
        return cls(True, names - {lock.name}, text)

    def unchanged(self, run_dir: Path) -> bool:
        return frozenset(os.listdir(run_dir)) - {RunLayout(run_dir).lock.name} == self.names


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RunDirClaimError(f"cannot open the run dir's lock {path}: {exc.strerror}") from None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise RunDirClaimError(f"cannot lock the run dir: {exc.strerror}") from None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(path: Path) -> str:
    """``PID HOST`` as the holder wrote it (empty when not yet written)."""
    for _ in range(20):  # the holder writes right after it locks: give it a moment
        try:
            text = path.read_text().strip()
        except OSError:
            return ""
        if text:
            return text
        time.sleep(0.01)
    return ""
