"""The journal: per-rank, append-only JSON Lines of events, and the reader that merges them.

Layout: ``RUN_DIR/journal/rank-<R>.jsonl``, one file per rank, appended to across
restarts. Each line is one event (see `harness.records.journal_schema` and `docs/journal.md`),
flushed to the operating system as it is written, so a killed process loses at most the
line it was writing. The reader skips such a torn line with a `TornLineWarning`.

JSON has no NaN or infinity; a non-finite float is written as the string ``"nan"``,
``"inf"`` or ``"-inf"`` and read back as a float wherever the schema says float.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

from faults.input_limits import InputLimitError, load_json, read_bytes
from harness.errors import JournalError
from harness.records.event_base import Reported
from harness.records.events import StepObserved
from harness.records.journal_schema import COMMON_FIELDS, EVENT_KINDS, SCHEMA_VERSION, field_spec
from harness.run_layout import RunLayout

_FILE_PATTERN = re.compile(r"rank-(\d+)\.jsonl")
#: How a non-finite float is written, and read back.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


R = TypeVar("R", bound=Reported)


class TornLineWarning(UserWarning):
    """A journal line could not be parsed (a writer was killed mid-line); it was skipped."""


def json_safe(value: Any) -> Any:
    """Make a value JSON-safe: non-finite floats become strings, tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class JournalWriter:
    """Appends events for one rank; safe to share between threads of that rank."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int = 0, restart: int = 0) -> None:
        self.path = RunLayout(run_dir).journal_file(rank)
        self.rank = rank
        self.restart = restart
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered: each event is one write(2), on disk for readers as soon as it returns.
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held open for the run
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        # A writer killed mid-line leaves no newline; end that line so the next event
        # starts on its own line and only the torn one is lost.
        if self._file.tell() == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                self._write(b"\n")

    def emit(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        """Write one event of ``kind`` at ``step``; returns the record as written."""
        _validate(kind, step, fields)
        record: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "kind": kind,
            "wall": time.time(),
            "mono": time.monotonic(),
            "rank": self.rank,
            "restart": self.restart,
            "step": step,
        }
        record.update(fields)
        try:
            line = _ENCODE(record)
        except ValueError:  # a NaN or an infinity: written as a string (see json_safe)
            line = _ENCODE(json_safe(record))
        with self._lock:
            if self._file.closed:
                raise JournalError(f"journal {self.path} is closed; cannot write {kind!r}")
            self._write((line + "\n").encode())
        return record

    def _write(self, data: bytes) -> None:
        while data:  # one write(2): to a regular file it writes all but after a signal
            data = data[self._file.write(data) or 0 :]

    def close(self) -> None:
        """Flush and close the file; later emits raise `JournalError`."""
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: One compact line per event; NaN and infinities refused (`json_safe` writes them).
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _validate(kind: str, step: int, fields: Mapping[str, Any]) -> None:
    if kind not in EVENT_KINDS:
        raise JournalError(
            f"unknown journal event kind {kind!r}; expected one of {', '.join(EVENT_KINDS)}"
        )
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise JournalError(f"{kind}.step must be a non-negative int, got {step!r}")
    specs = EVENT_KINDS[kind][1]
    for name, value in fields.items():
        spec = specs.get(name)
        if spec is None:
            hint = "a common field" if name in COMMON_FIELDS else "not in the schema"
            raise JournalError(f"{kind}.{name} is {hint}; {kind} takes {', '.join(specs)}")
        if not spec.accepts(value):
            raise JournalError(f"{kind}.{name} must be {spec.type}, got {value!r}")
    missing = [n for n, s in specs.items() if s.required and n not in fields]
    if missing:
        raise JournalError(f"{kind} event is missing required field(s): {', '.join(missing)}")


@dataclass(frozen=True, slots=True)
class Event:
    """One journal line, read back: the common fields plus the kind's own."""

    kind: str
    step: int
    rank: int
    restart: int
    wall: float
    mono: float
    fields: Mapping[str, Any] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    def get(self, name: str, default: Any = None) -> Any:
        """A kind-specific field, or ``default`` when absent."""
        return self.fields.get(name, default)

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def is_(self, *events: type[Reported]) -> bool:
        """True when this is an event of one of those kinds: ``e.is_(StepObserved)``."""
        if len(events) == 1:  # the common case, on every event of long journals
            return self.kind == events[0].kind
        return any(self.kind == event.kind for event in events)

    def as_(self, event: type[R]) -> R | None:
        """This event as ``event``'s dataclass: None when it is of another kind, or when
        its fields do not fit the schema (a required one missing, an unknown one, a wrong
        type). Such odd evidence stays readable field by field through `get`."""
        if self.kind != event.kind or not _fits(self.kind, self.fields):
            return None
        return event(**self.fields)


def _fits(kind: str, fields: Mapping[str, Any]) -> bool:
    """True when ``fields`` are what the schema says an event of ``kind`` holds."""
    specs = EVENT_KINDS[kind][1]
    return all(n in specs and specs[n].accepts(v) for n, v in fields.items()) and all(
        n in fields for n, s in specs.items() if s.required
    )


def decode_line(raw: str, path: Path, lineno: int) -> Event:
    """One journal line as an event (raises ValueError or JournalError for a bad one)."""
    record = load_json(raw, f"{path}:{lineno}")
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    version = record.get("v")
    if not isinstance(version, int):
        raise ValueError("no schema version")
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"{path}:{lineno} was written with journal schema v{version}; "
            f"this tightrope reads up to v{SCHEMA_VERSION}"
        )
    kind = record.get("kind")
    if not isinstance(kind, str):
        raise ValueError("no kind")
    for name in COMMON_FIELDS:
        if name not in record:
            raise ValueError(f"missing {name}")
    own = {}
    for name, value in record.items():
        if name in COMMON_FIELDS:
            continue
        spec = field_spec(kind, name)
        if spec is not None and spec.type == "float" and value in NONFINITE:
            value = NONFINITE[value]
        own[name] = value
    return Event(
        kind=kind,
        step=int(record["step"]),
        rank=int(record["rank"]),
        restart=int(record["restart"]),
        wall=float(record["wall"]),
        mono=float(record["mono"]),
        fields=own,
        v=version,
    )


def read_journal_file(path: str | os.PathLike[str], *, warn: bool = True) -> list[Event]:
    """Events of one rank's file in the order written, skipping torn lines (with a warning,
    unless ``warn`` is false: a torn tail is expected where a killed attempt is read)."""
    events, skipped = _read_file(Path(path))
    if warn:
        _warn(skipped)
    return events


def _read_file(path: Path) -> tuple[list[Event], list[str]]:
    """Events of one file, and a note for each torn line skipped."""
    try:
        data = read_bytes(path, "journal", None)
    except OSError as exc:
        raise JournalError(f"cannot read journal {path}: {exc.strerror}") from exc
    except InputLimitError as exc:
        raise JournalError(str(exc)) from None
    events: list[Event] = []
    skipped: list[str] = []
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            events.append(decode_line(raw.decode("utf-8"), path, lineno))
        except InputLimitError as exc:  # intact, but nested past what is read: not torn
            skipped.append(f"{exc}; the line was skipped")
        except (ValueError, UnicodeDecodeError) as exc:
            where = "last line" if lineno == len(lines) else f"line {lineno}"
            skipped.append(
                f"{path}: skipped torn {where} ({exc}); a writer was probably killed mid-line"
            )
    return events, skipped


def _warn(skipped: Sequence[str]) -> None:
    for note in skipped:
        warnings.warn(note, TornLineWarning, stacklevel=3)


class Journal(Sequence[Event]):
    """All events of a run, every rank and restart merged in time order."""

    def __init__(self, events: Sequence[Event], skipped: Sequence[str] = ()) -> None:
        self._events = list(events)
        #: A note for each torn line the reader skipped (a writer killed mid-line).
        self.skipped = tuple(skipped)

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        return self._events[index]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    @property
    def ranks(self) -> list[int]:
        """Ranks that wrote at least one event."""
        return sorted({e.rank for e in self._events})

    def of_kind(self, *kinds: str | type[Reported]) -> list[Event]:
        """Events of the given kinds (names, or their event classes), in order."""
        names = {k if isinstance(k, str) else k.kind for k in kinds}
        return [e for e in self._events if e.kind in names]

    def steps(self, rank: int = 0) -> dict[int, Event]:
        """The `step` events of one rank by step; a step redone after a restart keeps the
        last attempt, which is the one the run's final state descends from."""
        return {e.step: e for e in self._events if e.is_(StepObserved) and e.rank == rank}

    def losses(self, rank: int = 0) -> list[float]:
        """Loss per step for one rank, in step order (the surviving attempt of each step)."""
        steps = self.steps(rank)
        return [float(steps[s]["loss"]) for s in sorted(steps)]


def read_journal(run_dir: str | os.PathLike[str], *, warn: bool = True) -> Journal:
    """Read and merge every rank's journal under ``run_dir``.

    Each rank's events keep their written order; ranks are interleaved by wall time. Torn
    lines are skipped and noted in `Journal.skipped`; with ``warn`` each also raises a
    `TornLineWarning` (pass ``warn=False`` where a killed rank's torn tail is expected: no
    process-wide warning filter needs changing).
    """
    folder = RunLayout(run_dir).journal
    if not folder.is_dir():
        raise JournalError(f"no journal in {run_dir}: {folder} does not exist")
    files = sorted(
        (int(m.group(1)), p) for p in folder.iterdir() if (m := _FILE_PATTERN.fullmatch(p.name))
    )
    if not files:
        raise JournalError(f"no journal in {run_dir}: {folder} holds no rank-<R>.jsonl file")
    streams, skipped = [], []
    for _, path in files:
        events, torn = _read_file(path)
        streams.append(events)
        skipped.extend(torn)
    if warn:
        _warn(skipped)
    return Journal(list(heapq.merge(*streams, key=lambda e: e.wall)), skipped)
