"""The job's side of live control: the inbox rank 0 reads, and the board of armed faults
every rank takes from (the files and their contract: `harness.live.control`).

Rank 0 authenticates each command, refuses a replay or an expired one, checks the fault
against the job (a valid live fault, ranks the job has, a step within `MAX_IN_STEPS`) and
arms it by writing a signed entry under ``armed/``. Every rank checks each entry the same
way again before arming it: rank 0's signature, this attempt, not expired, not taken
before, the job's ranks and a step within bounds. Whatever fails is returned with its
reason (`Refused`), for the caller to journal; nothing here raises for what a file holds.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults import FaultSpec, FaultSpecError, parse_fault
from faults.input_limits import InputLimitError, read_bytes
from harness.live.control import (
    ARMED_EXPIRY_SECONDS,
    COMMAND_EXPIRY_SECONDS,
    MAX_IN_STEPS,
    SEEN_FILE,
    Answer,
    ControlError,
    ensure_secret,
    in_steps_problem,
    mac,
    read_control_file,
    read_secret,
    signed,
    validate_fault,
    write_atomic,
)
from harness.run_layout import RunLayout

#: The longest command id journaled or answered (a forged one may be any length).
MAX_ID = 100
#: The largest ``seen`` file read back (a job takes a few dozen bytes per command).
MAX_SEEN_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Received:
    """A command as the job read it: valid and ready to arm, or rejected with a reason."""

    id: str
    fault: dict[str, Any] | None
    in_steps: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Armed:
    """A command rank 0 armed, checked by this rank: its fault, at its step."""

    id: str
    spec: FaultSpec

    @property
    def step(self) -> int:
        """The step the fault fires at, the same on every rank."""
        assert self.spec.at_step is not None
        return self.spec.at_step


@dataclass(frozen=True, slots=True)
class Refused:
    """Something under ``control/`` that was not taken, and why (journaled by the caller)."""

    id: str
    reason: str


@dataclass(slots=True)
class BoardRead:
    """What one look at ``armed/`` found: entries to arm and entries refused."""

    armed: list[Armed] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


def rank_problem(fault: Mapping[str, Any], world_size: int | None) -> str:
    """Why ``fault`` names a rank the job lacks; empty when it names none (or the job's
    size is unknown: the spec's own bound then holds)."""
    ranks = fault.get("ranks")
    if world_size is None or not isinstance(ranks, list):
        return ""
    outside = [r for r in ranks if not (isinstance(r, int) and 0 <= r < world_size)]
    if outside:
        return f"ranks {outside} are not ranks of this job (ranks 0 to {world_size - 1})"
    return ""


def _short(text: object) -> str:
    return str(text)[:MAX_ID]


def _problem(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, InputLimitError) else f"{type(exc).__name__}: {exc}"


class FolderWatch:
    """Tells cheaply whether a folder changed: its mtime, with a full look every few calls
    in case the file system's clock is coarse."""

    EVERY = 50

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._mtime: int | None = None
        self._calls = 0

    def changed(self) -> bool:
        """True when the folder may hold something new since the last call."""
        self._calls += 1
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except OSError:
            return False
        if mtime != self._mtime or self._calls % self.EVERY == 0:
            self._mtime = mtime
            return True
        return False


class SeenIds:
    """The ids of commands the job took (``control/seen``), so a signed one is taken once,
    also by the process that follows a restart."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids: set[str] | None = None

    def _load(self) -> set[str]:
        if self._ids is None:
            try:
                data = read_bytes(self.path, "seen file", MAX_SEEN_BYTES, follow_symlinks=False)
                self._ids = set(data.decode("utf-8", "replace").split())
            except (OSError, InputLimitError):
                self._ids = set()  # none yet, or unreadable: commands still expire
        return self._ids

    def __contains__(self, command_id: str) -> bool:
        return command_id in self._load()

    def add(self, command_id: str) -> None:
        """Record ``command_id`` as taken; `OSError` when the file cannot hold it."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(self.path, flags, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{self.path} is not a regular file")
            os.write(fd, (command_id.replace("\n", " ") + "\n").encode())
        finally:
            os.close(fd)
        self._load().add(command_id)


class ControlChannel:
    """The job's side (rank 0): reads, authenticates, checks and answers commands."""

    def __init__(self, run_dir: str | os.PathLike[str], world_size: int | None = None) -> None:
        self.folder = RunLayout(run_dir).control
        self.key = ensure_secret(run_dir)
        self.world_size = world_size
        self._watch = FolderWatch(self.folder / "inbox")
        self._seen = SeenIds(self.folder / SEEN_FILE)

    def poll(self) -> list[Received]:
        """Commands waiting in the inbox, oldest first; each is removed once read.

        Nothing in the inbox can end the job: a file that vanished, a folder, a FIFO, a
        link, bytes too large or too deep to parse are each answered as refused."""
        if not self._watch.changed():
            return []
        found = []
        for path in (self.folder / "inbox").glob("*.json"):
            try:
                found.append((path.lstat().st_mtime, path))
            except OSError:
                continue  # withdrawn between the listing and the look
        received = []
        for _, path in sorted(found):
            received.append(self._read(path))
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        return received

    def _read(self, path: Path) -> Received:
        name = _short(path.stem)
        try:
            message = read_control_file(path, "command")
            body, signature = message["command"], message["mac"]
            command_id = _short(body["id"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            return Received(name, None, 0, f"unreadable command: {_problem(exc)}")
        if not isinstance(signature, str) or not hmac.compare_digest(
            signature, mac(self.key, body)
        ):
            return Received(command_id, None, 0, "authentication failed (wrong or no secret)")
        # Signed, so the id and time are the sender's: a copy of an old command is refused.
        stale = self._stale(command_id, body.get("issued"))
        if stale:
            return Received(command_id, None, 0, stale)
        in_steps = body.get("in_steps")
        problem = in_steps_problem(in_steps)
        if problem:
            return Received(command_id, None, 0, problem)
        try:
            fault = validate_fault(body.get("fault"), f"command {command_id}")
        except FaultSpecError as exc:
            return Received(command_id, None, 0, str(exc))
        problem = rank_problem(fault, self.world_size)
        if problem:
            return Received(command_id, None, 0, problem)
        assert isinstance(in_steps, int)
        return Received(command_id, fault, in_steps)

    def _stale(self, command_id: str, issued: object) -> str:
        """Why a signed command may not be taken (a replay, or too old); empty when fresh."""
        if command_id in self._seen:
            return "replayed: this command was taken already"
        try:
            self._seen.add(command_id)
        except OSError as exc:
            return f"cannot record it as taken ({exc}); refused so it cannot be replayed"
        if not isinstance(issued, (int, float)) or isinstance(issued, bool):
            return "the command carries no time of issue"
        age = time.time() - float(issued)
        if age > COMMAND_EXPIRY_SECONDS:
            return f"expired: issued {age:.0f} s ago (at most {COMMAND_EXPIRY_SECONDS:g} s)"
        if age < -COMMAND_EXPIRY_SECONDS:  # a clock far ahead would keep it fresh forever
            return f"issued {-age:.0f} s in the future (at most {COMMAND_EXPIRY_SECONDS:g} s)"
        return ""

    def answer(self, answer: Answer) -> None:
        """Write the job's answer where ``tightrope inject`` waits for it."""
        safe = "".join(c for c in answer.id if c.isalnum() or c in "-_") or "invalid"
        write_atomic(self.folder / "acks" / f"{safe}.json", answer.to_json())

    def publish(self, command_id: str, fault: Mapping[str, Any], step: int, attempt: int) -> None:
        """Arm an accepted command for every rank: ``fault`` at ``step`` of this attempt,
        signed, and refused by any rank that reads it after `ARMED_EXPIRY_SECONDS`."""
        armed = self.folder / "armed"
        numbers = [int(p.stem) for p in armed.glob("*.json") if p.stem.isdigit()]
        body = {
            "id": command_id,
            "fault": dict(fault),
            "step": step,
            "attempt": attempt,
            "expires": time.time() + ARMED_EXPIRY_SECONDS,
        }
        name = f"{max(numbers, default=-1) + 1:06d}.json"
        write_atomic(armed / name, json.dumps(signed(self.key, "armed", body)))


class ArmedBoard:
    """Every rank's view of ``armed/``: the entries of this attempt not taken yet, each
    checked before it is armed."""

    def __init__(
        self, run_dir: str | os.PathLike[str], attempt: int, world_size: int | None = None
    ) -> None:
        self.run_dir = run_dir
        self.folder = RunLayout(run_dir).control / "armed"
        self.attempt = attempt
        self.world_size = world_size
        self._key: bytes | None = None  # read when first needed: rank 0 may make it later
        self._looked: set[str] = set()  # file names looked at (each once)
        self._taken: set[str] = set()  # command ids armed
        self._watch = FolderWatch(self.folder)

    def take(self, step: int) -> BoardRead:
        """Entries armed since the last call, in the order rank 0 armed them, as of the
        start of step ``step``; each one refused says why."""
        read = BoardRead()
        if not self._watch.changed():
            return read
        for path in sorted(self.folder.glob("*.json")):
            if path.name in self._looked:
                continue
            self._looked.add(path.name)  # written whole (renamed into place): read once
            entry = self._check(path, step)
            if isinstance(entry, Armed):
                self._taken.add(entry.id)
                read.armed.append(entry)
            elif entry is not None:
                read.refused.append(entry)
        return read

    def _check(self, path: Path, step: int) -> Armed | Refused | None:
        """The entry at ``path`` armed, refused, or None when it belongs to another attempt."""
        where = f"armed/{_short(path.name)}"
        try:
            message = read_control_file(path, "armed entry")
            body, signature = message["armed"], message["mac"]
            command_id = _short(body["id"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            return Refused(where, f"unreadable armed entry: {_problem(exc)}")
        try:
            self._key = self._key or read_secret(self.run_dir)
        except ControlError as exc:
            return Refused(where, f"cannot authenticate it: {exc}")
        if not isinstance(signature, str) or not hmac.compare_digest(
            signature, mac(self._key, body)
        ):
            return Refused(where, "authentication failed (not armed by this job's rank 0)")
        if body.get("attempt") != self.attempt:
            return None  # an earlier attempt's, signed by its rank 0: done with
        if command_id in self._taken:
            return Refused(command_id, "replayed: this command was armed already")
        expires = body.get("expires")
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            return Refused(command_id, "the armed entry carries no expiry")
        if time.time() > expires:
            return Refused(command_id, "expired: armed too long ago to be taken now")
        at = body.get("step")
        last = step + MAX_IN_STEPS + 1  # rank 0 may be a step ahead
        if not isinstance(at, int) or isinstance(at, bool) or not 1 <= at <= last:
            return Refused(command_id, f"step must be a whole number from 1 to {last}, got {at!r}")
        try:
            fault = validate_fault(body.get("fault"), f"armed {command_id}")
            spec = parse_fault({**fault, "at_step": at}, f"armed {command_id}")
        except FaultSpecError as exc:
            return Refused(command_id, str(exc))
        problem = rank_problem(fault, self.world_size)
        if problem:
            return Refused(command_id, problem)
        return Armed(command_id, spec)
