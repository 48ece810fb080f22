"""The stages a document passes on its way into training (duplicate filter, semantic dedup,
toxicity filter, ...): one protocol, so the pipeline treats every stage alike.

A stage sees the documents that earlier stages kept, in stream order, a batch at a time, and
says of each whether it goes on. Its verdicts must depend only on the sequence of documents
it has seen (never on how that sequence was cut into batches), so a resumed run, which
restores the stage from its `state_dict`, decides exactly as the run it continues.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class StageVerdict:
    """What one stage decided about one document."""

    keep: bool
    reason: str
    """Why it was dropped ("exact", "near", "paraphrase", "toxic", ...); "kept" when kept."""


KEPT = StageVerdict(keep=True, reason="kept")


class DocumentStage(Protocol):
    """One filter of the document stream, named by the mechanism that switches it."""

    @property
    def name(self) -> str:
        """The stage's mechanism name, also the detector named in its claims."""
        ...

    def check_batch(self, documents: Sequence[Any]) -> list[StageVerdict]:
        """A verdict per document (anything with .index, .source, .text), in order."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to decide identically after a resume (tensors or plain data)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s output."""
        ...
