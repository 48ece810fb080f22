"""Live control: arm a fault in a job that is already running (the sender's side, and the
contract both sides share; the job's side is `harness.live.control_board`).

Files under ``RUN_DIR/control/`` (a folder of mode 0700)::

    secret              per-run key, 32 random bytes in hex, mode 0600, made by rank 0
    inbox/<id>.json     a command: the fault, how many steps from now, its time, its HMAC
    acks/<id>.json      the job's answer: accepted at step N, or rejected with a reason
    armed/<n>.json      an accepted command as rank 0 armed it: the fault, its step, the
                        attempt, an expiry, and its HMAC
    seen                ids of every command the job took, one a line (no replays)
    pids/rank-<R>       the process id each rank registered (process faults act on them)

Everything the job acts on is signed with HMAC-SHA256 under the run's secret and carries a
time after which it is refused, both for commands in the inbox and for what rank 0 arms:
a file someone wrote into ``control/`` without the secret arms nothing. Before anything is
armed it is checked against the job: the fault is a valid spec a live job can take, its
ranks are ranks of the job, its step at most `MAX_IN_STEPS` ahead. The job reads these
files only as regular files, opened with ``O_NOFOLLOW | O_NONBLOCK`` and sized after
opening (a FIFO or a link to ``/dev/zero`` is refused, never read), and nothing read from
them can end the job: each refusal is journaled and the step goes on. Commands are JSON;
nothing read from these files is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults import FaultSpecError, parse_fault
from faults.input_limits import InputLimitError, load_json, read_bytes
from faults.spec import Reach
from harness.errors import TightropeError
from harness.run_layout import RunLayout

SECRET_FILE = "secret"
#: Ids of every command the job took, one a line: a signed command is taken once.
SEEN_FILE = "seen"
#: A command read later than this after it was issued is refused as expired.
COMMAND_EXPIRY_SECONDS = 300.0
#: What rank 0 arms is refused by a rank that reads it later than this after it was armed
#: (every rank reads ``armed/`` when its next step begins).
ARMED_EXPIRY_SECONDS = 3600.0
#: The largest command (or armed entry, or answer) file read.
MAX_COMMAND_BYTES = 64 * 1024
#: The furthest ahead a live command may arm its fault (``inject --in-steps``).
MAX_IN_STEPS = 1_000_000
#: Where a fault may act that a live command cannot reach (the spec's ``reach``): a
#: document stream fixed at start, and nodes the suite runner acts on from outside.
UNDELIVERABLE: dict[Reach, str] = {
    "documents": "acts on the document stream the trainer set up at start",
    "node": "acts on a Docker node's container, which only the suite runner can reach",
}


class ControlError(TightropeError):
    """A command could not be sent or answered."""


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` whole (a temporary file renamed into place); the temporary file is
    created afresh, never through a link or a FIFO someone left under its name."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(tmp, flags, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_control_file(path: Path, what: str) -> Any:
    """A JSON file of ``control/``: a regular file, not followed through a link, at most
    `MAX_COMMAND_BYTES`, nested within bounds. `OSError` or `ValueError` (an
    `InputLimitError` names the limit) when it is none of these."""
    return load_json(read_bytes(path, what, MAX_COMMAND_BYTES, follow_symlinks=False), str(path))


def ensure_secret(run_dir: str | os.PathLike[str]) -> bytes:
    """The run's key, created with mode 0600 on first use."""
    folder = RunLayout(run_dir).control
    for sub in ("inbox", "acks", "pids", "armed"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return read_secret(run_dir)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return read_secret(run_dir)


def read_secret(run_dir: str | os.PathLike[str]) -> bytes:
    """The run's key; refuses a missing key, a link, or one that others can read."""
    path = RunLayout(run_dir).control / SECRET_FILE
    try:
        mode = stat.S_IMODE(path.lstat().st_mode)
        key = read_bytes(path, "the run's secret", 1024, follow_symlinks=False).decode().strip()
    except FileNotFoundError:
        raise ControlError(
            f"{run_dir} has no control channel ({path} is missing): the job is not running "
            "under tightrope, or has not started yet"
        ) from None
    except OSError as exc:
        raise ControlError(f"cannot read {path}: {exc.strerror}") from exc
    except InputLimitError as exc:
        raise ControlError(str(exc)) from None
    except UnicodeDecodeError:
        raise ControlError(f"{path} is not the run's secret (not text)") from None
    if mode & 0o077:
        raise ControlError(f"{path} is readable by others (mode {mode:o}); expected 600")
    return key.encode()


def mac(key: bytes, body: Mapping[str, Any]) -> str:
    """HMAC-SHA256 of ``body`` (canonical JSON) under the run's key."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def signed(key: bytes, field: str, body: dict[str, Any]) -> dict[str, Any]:
    """``{field: body, "mac": ...}``: what the job accepts as written with the secret."""
    return {field: body, "mac": mac(key, body)}


def validate_fault(fault: Mapping[str, Any], where: str = "command") -> dict[str, Any]:
    """A fault as a live command carries it: no trigger (the job sets ``at_step``)."""
    if not isinstance(fault, Mapping):
        raise FaultSpecError(f"{where}: the fault must be a mapping, got {type(fault).__name__}")
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


def in_steps_problem(in_steps: object) -> str:
    """Why ``in_steps`` is no count of steps from 0 to `MAX_IN_STEPS`; empty when it is."""
    if type(in_steps) is int and 0 <= in_steps <= MAX_IN_STEPS:  # (a bool is no count)
        return ""
    return f"in_steps must be a whole number from 0 to {MAX_IN_STEPS}, got {in_steps!r}"


@dataclass(frozen=True, slots=True)
class Command:
    """One command as sent: the fault and how many steps from receipt it fires."""

    id: str
    fault: dict[str, Any]
    in_steps: int


def send(run_dir: str | os.PathLike[str], fault: Mapping[str, Any], in_steps: int = 1) -> Command:
    """Validate, sign and drop a command into the job's inbox."""
    problem = in_steps_problem(in_steps)
    if problem:
        raise ControlError(f"--{problem.replace('_', '-')}")
    checked = validate_fault(fault)
    body: dict[str, Any] = {"fault": checked, "in_steps": in_steps, "issued": time.time()}
    key = read_secret(run_dir)
    command_id = f"c{int(time.time())}-{secrets.token_hex(4)}"
    body["id"] = command_id
    path = RunLayout(run_dir).control / "inbox" / f"{command_id}.json"
    write_atomic(path, json.dumps(signed(key, "command", body)))
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
    def from_data(cls, data: Any) -> Answer:
        """An answer read back; a `ControlError` when the data is not one."""
        try:
            return cls(**data)
        except TypeError as exc:
            raise ControlError(f"the job's answer is unreadable: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> Answer:
        """An answer read back from its text; a `ControlError` when it is not one."""
        try:
            data = load_json(text, "the job's answer")
        except ValueError as exc:
            raise ControlError(f"the job's answer is unreadable: {exc}") from None
        return cls.from_data(data)


def wait_for_answer(
    run_dir: str | os.PathLike[str], command_id: str, timeout: float
) -> Answer | None:
    """The job's answer to a command, or None when none came within ``timeout`` (the
    unread command is then withdrawn so it cannot fire later by surprise)."""
    ack = RunLayout(run_dir).control / "acks" / f"{command_id}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ack.exists():
            try:
                return Answer.from_data(read_control_file(ack, "the job's answer"))
            except (OSError, ValueError) as exc:
                raise ControlError(f"the job's answer {ack} is unreadable: {exc}") from None
        time.sleep(0.05)
    (RunLayout(run_dir).control / "inbox" / f"{command_id}.json").unlink(missing_ok=True)
    return None


def register_pid(run_dir: str | os.PathLike[str], rank: int, pid: int) -> None:
    """Record the process id of one rank (process faults act on it)."""
    folder = RunLayout(run_dir).control / "pids"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / f"rank-{rank}", str(pid))


def registered_pids(run_dir: str | os.PathLike[str]) -> dict[int, int]:
    """Process ids by rank, as the job registered them (a file that is no number is
    skipped)."""
    folder = RunLayout(run_dir).control / "pids"
    pids = {}
    for path in folder.glob("rank-*") if folder.is_dir() else []:
        try:
            text = read_bytes(path, "pid file", 64, follow_symlinks=False).decode()
            pids[int(path.name.removeprefix("rank-"))] = int(text)
        except (OSError, ValueError):
            continue
    return pids
