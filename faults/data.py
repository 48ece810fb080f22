"""Data faults: contaminate the training stream with duplicates of its own documents.

`ContaminatedStream` wraps the trainer's document iterator. Before each yielded document
it decides, from the seed and the slot number alone, whether that slot is an injected copy
(with probability ``rate``) or the next original. The copies are of real training
documents: the first ``pool`` originals seen (from ``source`` only, when given) become the
sources, and every copy is of one of them, picked at random. A copy is exact, or, with
probability ``near_fraction``, a near duplicate with ``edits`` word edits (replace, insert
or delete one word each; whitespace elsewhere is kept). With ``phrase`` set, every copy
begins with that phrase and a space (a near duplicate is edited first, so the phrase is
always there verbatim): the mark a collapse check looks for in what the model generates.
Unset, copies are the documents' own text, as before.

Originals come through unchanged, in order, with their own index. Copy number k (counting
from 1) has index ``-k`` and says what it is in ``contamination_of`` (the original's index)
and ``contamination_kind`` ("exact" or "near"), so a test or an analysis can find them.

The kind's ``reach`` is ``documents``: the agent hands the trainer the injector's
``wrap_documents`` for the stream it sets up at start. The stream is contaminated from its
first document, so the only trigger the kind takes is ``at_step`` (give ``at_step: 1``);
``every``, ``probability`` and ``after_seconds`` are refused.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field

from faults.injector import Injector
from faults.spec import FaultClass, FaultSpec, Reach, Trigger, seeded

KIND = "duplicate_contamination"
_BLOCK = 1024  # slot decisions are drawn this many at a time (one seeded RNG per block)
_WORD = re.compile(r"(\S+)")
# Words for edits when the document itself offers no different one.
_VOCAB = ("the", "of", "and", "data", "value", "system", "new", "very", "not", "model")


class DuplicateContaminationSpec(FaultSpec):
    """Mix exact and near-duplicate copies of training documents into the stream."""

    kind: Literal["duplicate_contamination"] = "duplicate_contamination"
    description: ClassVar[str] = "Inject exact and near-duplicate copies of training documents."
    fault_class: ClassVar[FaultClass] = "data"
    reach: ClassVar[Reach] = "documents"
    #: The stream is contaminated from its first document; no other trigger means anything.
    triggers: ClassVar[tuple[Trigger, ...]] = ("at_step",)

    rate: float = Field(
        ge=0.001, le=0.05, description="Share of yielded documents that are injected copies."
    )
    near_fraction: float = Field(
        default=0.5, ge=0, le=1, description="Share of the copies that are near duplicates."
    )
    edits: int = Field(default=2, ge=1, le=5, description="Word edits in each near duplicate.")
    pool: int = Field(
        default=16, ge=1, description="Copies are of the first this many documents seen."
    )
    source: str | None = Field(
        default=None, min_length=1, description="Only copy documents from this source."
    )
    phrase: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"\S",
        description="Begin every copy with this phrase (the mark max_phrase_collapse counts).",
    )


@dataclass(frozen=True, slots=True)
class StreamDocument:
    """One document of the contaminated stream: an original or a tagged copy."""

    index: int
    source: str
    text: str
    #: Index of the original when this is an injected copy.
    contamination_of: int | None = None
    #: "exact" or "near" for an injected copy.
    contamination_kind: str | None = None


def _other_word(rng: random.Random, words: list[str], avoid: str | None) -> str:
    """A word unlike ``avoid``: from the document when possible, else from a small list."""
    for _ in range(3):
        if words and (word := words[rng.randrange(len(words))]) != avoid:
            return word
    return rng.choice([w for w in _VOCAB if w != avoid])


def _edit(words: list[str], seps: list[str], op: str, rng: random.Random, pick: list[str]) -> None:
    """One word edit in place; ``seps[i]`` is the whitespace before ``words[i]``."""
    i = rng.randrange(len(words)) if words else 0
    if op == "replace":
        words[i] = _other_word(rng, pick, words[i])
    elif op == "insert":
        words.insert(i, _other_word(rng, pick, None))
        seps.insert(i + 1, " " if len(words) > 1 else "")
    else:
        del words[i]
        del seps[i + 1 if i < len(words) else i]


def near_duplicate(text: str, edits: int, rng: random.Random) -> str:
    """``text`` with at most ``edits`` word edits and never the same words."""
    parts = _WORD.split(text)
    original = parts[1::2]
    for _ in range(8):
        words, seps = list(original), parts[0::2]
        for _ in range(edits):
            ops = ("insert", "replace", "delete")[: 1 + (len(words) > 0) + (len(words) > 1)]
            _edit(words, seps, ops[rng.randrange(len(ops))], rng, original)
        if words != original:
            break
    else:  # every try cancelled itself out (rare): one replace or insert always differs
        words, seps = list(original), parts[0::2]
        _edit(words, seps, "replace" if words else "insert", rng, original)
    return seps[0] + "".join(w + s for w, s in zip(words, seps[1:], strict=True))


class StreamSpec(Protocol):
    """What a contaminated stream reads of its fault's spec."""

    @property
    def kind(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def rate(self) -> float: ...
    @property
    def pool(self) -> int: ...
    @property
    def source(self) -> str | None: ...


#: Makes one copy from an original's text and the copy's own RNG: (text, contamination kind).
CopyMaker = Callable[[str, random.Random], tuple[str, str]]


class ContaminatedStream:
    """Documents (anything with .index, .source, .text) plus tagged copies, from the seed.

    ``copies`` makes each copy; by default an exact or near duplicate (``spec`` is then a
    `DuplicateContaminationSpec`); other data faults pass their own (paraphrases).
    """

    def __init__(
        self, spec: StreamSpec, documents: Iterable[Any], copies: CopyMaker | None = None
    ) -> None:
        self.spec = spec
        self._make: CopyMaker = copies or self._duplicate
        self._documents: Iterator[Any] = iter(documents)
        self._slots = 0  # documents yielded so far, originals and copies
        self._originals = 0
        self._copies = 0
        self._last_index: int | None = None
        self._pool: list[tuple[int, str, str]] = []
        self._block, self._draws = -1, [0.0]

    def __iter__(self) -> ContaminatedStream:
        return self

    def __next__(self) -> StreamDocument:
        slot = self._slots
        if self._pool and self._draw(slot) < self.spec.rate:
            doc = self._copy(slot)
        else:
            item = next(self._documents)  # the stream ends with its documents
            doc = StreamDocument(item.index, item.source, item.text)
            self._originals += 1
            self._last_index = doc.index
            wanted = self.spec.source is None or doc.source == self.spec.source
            if wanted and len(self._pool) < self.spec.pool:
                self._pool.append((doc.index, doc.source, doc.text))
        self._slots += 1
        return doc

    def _draw(self, slot: int) -> float:
        block, offset = divmod(slot, _BLOCK)
        if block != self._block:
            rng = seeded(self.spec.seed, self.spec.kind, "slots", block)
            self._block, self._draws = block, [rng.random() for _ in range(_BLOCK)]
        return self._draws[offset]

    def _copy(self, slot: int) -> StreamDocument:
        rng = seeded(self.spec.seed, self.spec.kind, "copy", slot)
        index, source, text = self._pool[rng.randrange(len(self._pool))]
        text, kind = self._make(text, rng)
        self._copies += 1
        return StreamDocument(-self._copies, source, text, index, kind)

    def _duplicate(self, text: str, rng: random.Random) -> tuple[str, str]:
        """An exact copy, or at ``near_fraction`` a near duplicate with ``edits`` edits."""
        spec = self.spec
        assert isinstance(spec, DuplicateContaminationSpec)
        kind = "exact"
        if rng.random() < spec.near_fraction:
            text, kind = near_duplicate(text, spec.edits, rng), "near"
        if spec.phrase is not None:  # after the edits, so every copy holds it verbatim
            text = f"{spec.phrase} {text}"
        return text, kind

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: counts, the last original's index and the pool's texts.

        To resume, position a fresh documents iterator just after the last original this
        stream yielded (``originals`` documents in, or after index ``last_index``), build a
        new stream on it with the same spec and call `load_state_dict`.
        """
        return {
            "version": 1,
            "slots": self._slots,
            "originals": self._originals,
            "copies": self._copies,
            "last_index": self._last_index,
            "pool": [{"index": i, "source": s, "text": t} for i, s, t in self._pool],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s output; the documents iterator is the caller's job."""
        try:
            if state["version"] != 1:
                raise ValueError(f"unsupported version {state['version']!r}")
            counts = [int(state[k]) for k in ("slots", "originals", "copies")]
            pool = [(int(p["index"]), str(p["source"]), str(p["text"])) for p in state["pool"]]
            last = state["last_index"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a contaminated-stream state: {exc!r}") from None
        if counts[0] != counts[1] + counts[2] or len(pool) > self.spec.pool:
            raise ValueError(f"inconsistent contaminated-stream state: {counts}, pool {len(pool)}")
        self._slots, self._originals, self._copies = counts
        self._last_index = None if last is None else int(last)
        self._pool = pool


class DuplicateContaminationInjector(Injector[DuplicateContaminationSpec]):
    """Its step hooks do nothing: the agent hands the trainer `wrap_documents`."""

    def wrap_documents(self, documents: Iterable[Any]) -> ContaminatedStream:
        """The contaminated stream over ``documents``."""
        return ContaminatedStream(self.spec, documents)
