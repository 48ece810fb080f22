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
from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import Field

from faults.bias import Bias
from faults.document_stream import InjectedStream, SlotSpec
from faults.document_stream import StreamDocument as StreamDocument
from faults.injector import Injector
from faults.spec import FaultClass, FaultSpec, Reach, Trigger, seeded

KIND = "duplicate_contamination"
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

    rate: Annotated[float, Bias((0.05, 0.001))] = Field(
        ge=0.001, le=0.05, description="Share of yielded documents that are injected copies."
    )
    near_fraction: Annotated[float, Bias((0.0, 1.0))] = Field(
        default=0.5, ge=0, le=1, description="Share of the copies that are near duplicates."
    )
    edits: Annotated[int, Bias()] = Field(
        default=2, ge=1, le=5, description="Word edits in each near duplicate."
    )
    pool: Annotated[int, Bias(upto=64)] = Field(
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


class StreamSpec(SlotSpec, Protocol):
    """What a contaminated stream reads of its fault's spec: its slots' fields and more."""

    @property
    def pool(self) -> int: ...
    @property
    def source(self) -> str | None: ...


#: Makes one copy from an original's text and the copy's own RNG: (text, contamination kind).
CopyMaker = Callable[[str, random.Random], tuple[str, str]]


class ContaminatedStream(InjectedStream):
    """Documents (anything with .index, .source, .text) plus tagged copies, from the seed.

    ``copies`` makes each copy; by default an exact or near duplicate (``spec`` is then a
    `DuplicateContaminationSpec`); other data faults pass their own (paraphrases).
    """

    state_name = "contaminated-stream"
    injected_key = "copies"

    def __init__(
        self, spec: StreamSpec, documents: Iterable[Any], copies: CopyMaker | None = None
    ) -> None:
        super().__init__(spec, documents)
        self.spec: StreamSpec = spec
        self._make: CopyMaker = copies or self._duplicate
        self._last_index: int | None = None
        self._pool: list[tuple[int, str, str]] = []

    def _may_inject(self) -> bool:
        return bool(self._pool)  # a copy needs an original to copy

    def _passed(self, doc: StreamDocument) -> None:
        self._last_index = doc.index
        wanted = self.spec.source is None or doc.source == self.spec.source
        if wanted and len(self._pool) < self.spec.pool:
            self._pool.append((doc.index, doc.source, doc.text))

    def _inject(self, slot: int) -> StreamDocument:
        rng = seeded(self.spec.seed, self.spec.kind, "copy", slot)
        index, source, text = self._pool[rng.randrange(len(self._pool))]
        text, kind = self._make(text, rng)
        return StreamDocument(-self._injected, source, text, index, kind)

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

    def _extra_state(self) -> dict[str, Any]:
        # The last original's index, and the pool's texts.
        pool = [{"index": i, "source": s, "text": t} for i, s, t in self._pool]
        return {"last_index": self._last_index, "pool": pool}

    def _read_extra(self, state: dict[str, Any]) -> tuple[int | None, list[tuple[int, str, str]]]:
        pool = [(int(p["index"]), str(p["source"]), str(p["text"])) for p in state["pool"]]
        last = state["last_index"]
        return (None if last is None else int(last)), pool

    def _extra_fits(self, extra: tuple[int | None, list[tuple[int, str, str]]]) -> bool:
        return len(extra[1]) <= self.spec.pool

    def _set_extra(self, extra: tuple[int | None, list[tuple[int, str, str]]]) -> None:
        self._last_index, self._pool = extra


class DuplicateContaminationInjector(Injector[DuplicateContaminationSpec]):
    """Its step hooks do nothing: the agent hands the trainer `wrap_documents`."""

    def wrap_documents(self, documents: Iterable[Any]) -> ContaminatedStream:
        """The contaminated stream over ``documents``."""
        return ContaminatedStream(self.spec, documents)
