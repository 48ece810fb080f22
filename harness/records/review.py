"""The toxicity filter's review queue and the decisions on it: two JSONL files of a run
directory whose format is defined here, so that the trainer (which writes the queue and
reads the decisions) and `tightrope review` (which reads the queue and writes decisions)
agree without either importing the other.

``RUN_DIR/data/review-queue.jsonl``, one object per held document::

    {"id": "d17-3fa2b1c09e", "index": 17, "source": "social_chatter", "score": 0.54,
     "excerpt": "the sentence that was scored ..."}

``RUN_DIR/data/review-decisions.jsonl``, one object per decision; the last one for an id
wins::

    {"id": "d17-3fa2b1c09e", "decision": "accept"}

Both are appended a whole line at a time. A line that is not such an object is an error
naming the file and line, never skipped silently: a decision lost to a torn line would
quietly change what the model trains on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from faults.input_limits import InputLimitError, load_json, read_bytes
from harness.errors import TightropeError

Decision = Literal["accept", "reject"]
DECISIONS: tuple[Decision, ...] = ("accept", "reject")

#: Characters of a document's text kept in its queue entry.
EXCERPT_CHARS = 240


class ReviewError(TightropeError):
    """A review file is malformed, or a decision names an id that was never queued."""


def document_id(index: int, text: str) -> str:
    """A queued document's id: its stream index plus a digest of its text, so a decision
    applies only to the very document reviewed."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=5).hexdigest()
    return f"d{index}-{digest}"


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One document held for review."""

    id: str
    index: int
    source: str
    score: float
    excerpt: str


def _append(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
    # One write of a whole line to a file opened for appending: lines never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.exists() and not path.is_symlink():
        return []
    try:  # a regular file only: a FIFO or a link to a device would never end
        text = read_bytes(path, "review file", None).decode("utf-8")
    except InputLimitError as exc:
        raise ReviewError(str(exc)) from None
    except OSError as exc:
        raise ReviewError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ReviewError(f"{path}: not UTF-8 text ({exc.reason})") from None
    out = []
    parts = text.split("\n")  # (not splitlines: a U+2028 inside a JSON string is no end)
    for number, part in enumerate(parts, 1):
        line = part + "\n" if number < len(parts) else part
        if not line.strip():
            continue
        try:
            obj = load_json(line, f"{path}:{number}")
        except InputLimitError as exc:
            raise ReviewError(str(exc)) from None
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or not line.endswith("\n"):
            raise ReviewError(f"{path}:{number}: not a whole JSON object line (torn write?)")
        out.append((number, obj))
    return out


def append_entry(path: Path, entry: QueueEntry) -> None:
    """Add one held document to the queue."""
    _append(path, asdict(entry))


def read_queue(path: Path) -> list[QueueEntry]:
    """Every queued document, in the order queued (an id queued twice appears once)."""
    out: dict[str, QueueEntry] = {}
    for number, obj in _lines(path):
        try:
            entry = QueueEntry(
                id=str(obj["id"]),
                index=int(obj["index"]),
                source=str(obj["source"]),
                score=float(obj["score"]),
                excerpt=str(obj["excerpt"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReviewError(f"{path}:{number}: not a queue entry ({exc!r})") from None
        out.setdefault(entry.id, entry)
    return list(out.values())


def append_decision(path: Path, doc_id: str, decision: Decision) -> None:
    """Record one decision (it overrides any earlier one for the same id)."""
    if decision not in DECISIONS:
        raise ReviewError(f"decision must be one of {', '.join(DECISIONS)} (got {decision!r})")
    _append(path, {"id": doc_id, "decision": decision})


def read_decisions(path: Path) -> dict[str, Decision]:
    """id -> the last decision recorded for it."""
    out: dict[str, Decision] = {}
    for number, obj in _lines(path):
        doc_id, decision = obj.get("id"), obj.get("decision")
        if not isinstance(doc_id, str) or decision not in DECISIONS:
            raise ReviewError(
                f"{path}:{number}: expected {{'id': str, 'decision': 'accept' or 'reject'}}"
            )
        out[doc_id] = decision
    return out
