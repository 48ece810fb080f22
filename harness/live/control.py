"""Live control: arm a fault in a job that is already running.

Files under ``RUN_DIR/control/``::

    secret              per-run key, 32 random bytes in hex, mode 0600, made by rank 0
    inbox/<id>.json     a command: the fault, how many steps from now, and its HMAC
    acks/<id>.json      the job's answer: accepted at step N, or rejected with a reason
    armed/<n>.json      an accepted command as rank 0 armed it: the fault, its step
    pids/rank-<R>       the process id each rank registered (process faults act on them)

A command is authenticated with HMAC-SHA256 under the secret, validated as a fault
spec, and, when accepted, armed on every rank for the same step: rank 0 decides the step
and writes it under ``armed/``, where every rank looks at each step's start (one
``stat`` of the folder while nothing changes). No collective is spent on it: ranks that
train together are at most a step apart, so a command armed for a later step reaches
every rank in time. Commands are JSON; nothing read from these files is ever unpickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults import FaultSpecError, parse_fault
from faults.spec import Reach
from harness.errors import TightropeError
from harness.run_layout import RunLayout

SECRET_FILE = "secret"
#: Ids of every command the job took, one a line: a signed command is taken once.
SEEN_FILE = "seen"
#: A command read later than this after it was issued is refused as expired.
COMMAND_EXPIRY_SECONDS = 300.0
#: The largest command file the job reads.
MAX_COMMAND_BYTES = 64 * 1024
#: Where a fault may act that a live command cannot reach (the spec's ``reach``): a
#: document stream fixed at start, and nodes the suite runner acts on from outside.
UNDELIVERABLE: dict[Reach, str] = {
    "documents": "acts on the document stream the trainer set up at start",
    "node": "acts on a Docker node's container, which only the suite runner can reach",
}


class ControlError(TightropeError):
    """A command could not be sent or answered."""


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def ensure_secret(run_dir: str | os.PathLike[str]) -> bytes:
    """The run's key, created with mode 0600 on first use."""
    folder = RunLayout(run_dir).control
    for sub in ("inbox", "acks", "pids", "armed"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(run_dir)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return read_secret(run_dir)


def read_secret(run_dir: str | os.PathLike[str]) -> bytes:
    """The run's key; refuses a missing key or one that others can read."""
    path = RunLayout(run_dir).control / SECRET_FILE
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        key = path.read_text().strip()
    except FileNotFoundError:
        raise ControlError(
            f"{run_dir} has no control channel ({path} is missing): the job is not running "
            "under tightrope, or has not started yet"
        ) from None
    except OSError as exc:
        raise ControlError(f"cannot read {path}: {exc.strerror}") from exc
    if mode & 0o077:
        raise ControlError(f"{path} is readable by others (mode {mode:o}); expected 600")
    return key.encode()


def _mac(key: bytes, body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def validate_fault(fault: Mapping[str, Any], where: str = "command") -> dict[str, Any]:
    """A fault as a live command carries it: no trigger (the job sets ``at_step``)."""
    triggers = {"at_step", "every", "probability", "after_seconds"} & fault.keys()
    if triggers:
        raise FaultSpecError(
            f"{where}: a live command takes effect --in-steps from now; drop "
            f"{', '.join(sorted(triggers))}"
        )
    spec = parse_fault({**fault, "at_step": 1}, where)
    why = UNDELIVERABLE.get(spec.reach)
    if why is not None:
        raise FaultSpecError(f"{where}: {spec.kind} cannot be injected live: it {why}")
    return dict(fault)


@dataclass(frozen=True, slots=True)
class Command:
    """One command as sent: the fault and how many steps from receipt it fires."""

    id: str
    fault: dict[str, Any]
    in_steps: int


def send(run_dir: str | os.PathLike[str], fault: Mapping[str, Any], in_steps: int = 1) -> Command:
    """Validate, sign and drop a command into the job's inbox."""
    if in_steps < 0:
        raise ControlError(f"--in-steps must be >= 0, got {in_steps}")
    checked = validate_fault(fault)
    body: dict[str, Any] = {"fault": checked, "in_steps": in_steps, "issued": time.time()}
    key = read_secret(run_dir)
    command_id = f"c{int(time.time())}-{secrets.token_hex(4)}"
    body["id"] = command_id
    message = {"command": body, "mac": _mac(key, body)}
    _write_atomic(RunLayout(run_dir).control / "inbox" / f"{command_id}.json", json.dumps(message))
    return Command(command_id, checked, in_steps)


@dataclass(frozen=True, slots=True)
class Answer:
    """The job's answer to one command: armed for ``effective_step``, or refused."""

    id: str
    #: The step the job was at when it read the command.
    step: int
    accepted: bool
    effective_step: int | None = None
    reason: str = ""

    def to_json(self) -> str:
        """The answer as the job writes it."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Answer:
        """An answer read back; a `ControlError` when the file is not one."""
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise ControlError(f"the job's answer is unreadable: {exc}") from None


def wait_for_answer(
    run_dir: str | os.PathLike[str], command_id: str, timeout: float
) -> Answer | None:
    """The job's answer to a command, or None when none came within ``timeout`` (the
    unread command is then withdrawn so it cannot fire later by surprise)."""
    ack = RunLayout(run_dir).control / "acks" / f"{command_id}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ack.exists():
            return Answer.from_json(ack.read_text())
        time.sleep(0.05)
    (RunLayout(run_dir).control / "inbox" / f"{command_id}.json").unlink(missing_ok=True)
    return None


@dataclass(frozen=True, slots=True)
class Received:
    """A command as the job read it: valid and ready to arm, or rejected with a reason."""

    id: str
    fault: dict[str, Any] | None
    in_steps: int
    reason: str = ""


class ControlChannel:
    """The job's side (rank 0): reads, authenticates and answers commands."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.folder = RunLayout(run_dir).control
        self.key = ensure_secret(run_dir)
        self._seen = FolderWatch(self.folder / "inbox")

    def poll(self) -> list[Received]:
        """Commands waiting in the inbox, oldest first; each is removed once read.

        Nothing in the inbox can end the job: a file that vanished, a folder, bytes too
        large or too deep to parse are each skipped or answered as refused."""
        inbox = self.folder / "inbox"
        if not self._seen.changed():
            return []
        found = []
        for path in inbox.glob("*.json"):
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
        name = path.stem
        try:
            if path.lstat().st_size > MAX_COMMAND_BYTES:
                return Received(name, None, 0, f"command larger than {MAX_COMMAND_BYTES} bytes")
            message = json.loads(path.read_text(encoding="utf-8"))
            body, mac = message["command"], message["mac"]
            command_id = str(body["id"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            return Received(name, None, 0, f"unreadable command: {type(exc).__name__}: {exc}")
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(self.key, body)):
            return Received(command_id, None, 0, "authentication failed (wrong or no secret)")
        # Signed, so the id and time are the sender's: a copy of an old command is refused.
        stale = self._stale(command_id, body.get("issued"))
        if stale:
            return Received(command_id, None, 0, stale)
        try:
            fault = validate_fault(body["fault"], f"command {command_id}")
            in_steps = int(body["in_steps"])
        except (FaultSpecError, KeyError, TypeError, ValueError) as exc:
            return Received(command_id, None, 0, str(exc))
        return Received(command_id, fault, max(in_steps, 0))

    def _stale(self, command_id: str, issued: object) -> str:
        """Why a signed command may not be taken (a replay, or too old); empty when fresh."""
        seen = self.folder / SEEN_FILE
        try:
            taken = set(seen.read_text().split()) if seen.is_file() else set()
        except OSError:
            taken = set()
        if command_id in taken:
            return "replayed: this command was taken already"
        with open(seen, "a") as f:
            f.write(command_id + "\n")
        if not isinstance(issued, (int, float)) or isinstance(issued, bool):
            return "the command carries no time of issue"
        age = time.time() - float(issued)
        if age > COMMAND_EXPIRY_SECONDS:
            return f"expired: issued {age:.0f} s ago (at most {COMMAND_EXPIRY_SECONDS:g} s)"
        return ""

    def answer(self, answer: Answer) -> None:
        """Write the job's answer where ``tightrope inject`` waits for it."""
        safe = "".join(c for c in answer.id if c.isalnum() or c in "-_") or "invalid"
        _write_atomic(self.folder / "acks" / f"{safe}.json", answer.to_json())

    def publish(self, command_id: str, fault: Mapping[str, Any], step: int, attempt: int) -> None:
        """Arm an accepted command for every rank: ``fault`` at ``step`` of this attempt."""
        armed = self.folder / "armed"
        number = sum(1 for p in armed.glob("*.json"))
        body = {"id": command_id, "fault": dict(fault), "step": step, "attempt": attempt}
        _write_atomic(armed / f"{number:06d}.json", json.dumps(body))


@dataclass(frozen=True, slots=True)
class Armed:
    """A command rank 0 armed: this fault at this step."""

    id: str
    fault: dict[str, Any]
    step: int


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


class ArmedBoard:
    """Every rank's view of ``armed/``: the commands of this attempt not taken yet."""

    def __init__(self, run_dir: str | os.PathLike[str], attempt: int) -> None:
        self.folder = RunLayout(run_dir).control / "armed"
        self.attempt = attempt
        self._taken: set[str] = set()
        self._watch = FolderWatch(self.folder)

    def take(self) -> list[Armed]:
        """Commands armed since the last call, in the order rank 0 armed them."""
        if not self._watch.changed():
            return []
        found = []
        for path in sorted(self.folder.glob("*.json")):
            if path.name in self._taken:
                continue
            try:
                body = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # not complete yet: written atomically, so only a race with a rename
            self._taken.add(path.name)
            if isinstance(body, dict) and body.get("attempt") == self.attempt:
                found.append(Armed(str(body["id"]), dict(body["fault"]), int(body["step"])))
        return found


def register_pid(run_dir: str | os.PathLike[str], rank: int, pid: int) -> None:
    """Record the process id of one rank (process faults act on it)."""
    folder = RunLayout(run_dir).control / "pids"
    folder.mkdir(parents=True, exist_ok=True)
    _write_atomic(folder / f"rank-{rank}", str(pid))


def registered_pids(run_dir: str | os.PathLike[str]) -> dict[int, int]:
    """Process ids by rank, as the job registered them."""
    folder = RunLayout(run_dir).control / "pids"
    pids = {}
    for path in folder.glob("rank-*") if folder.is_dir() else []:
        try:
            pids[int(path.name.removeprefix("rank-"))] = int(path.read_text())
        except ValueError:
            continue
    return pids
