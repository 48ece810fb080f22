"""A document stream with injected documents mixed in, slot by slot, from the seed alone.

Every fault whose ``reach`` is ``documents`` wraps the trainer's documents the same way: at
each slot a seeded draw says whether an injected document goes there (with probability
``rate``) or the next original passes through unchanged. The counts (slots, originals,
injected) are the stream's place: `state_dict` saves them and `load_state_dict` restores
them on a fresh stream over documents positioned after the last original. `InjectedStream`
does this once; each kind says what it injects and what else it remembers
(`faults.data.ContaminatedStream`, `faults.toxic.ToxicStream`,
`faults.tokenizer_stress.StressedStream`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from faults.spec import seeded

_BLOCK = 1024  # slot decisions are drawn this many at a time (one seeded RNG per block)


@dataclass(frozen=True, slots=True)
class StreamDocument:
    """One document of the stream: an original or a tagged injected one."""

    index: int
    source: str
    text: str
    #: Index of the original when this is an injected copy.
    contamination_of: int | None = None
    #: What the injected document is ("exact", "near", "toxic", ...); None for an original.
    contamination_kind: str | None = None


class SlotSpec(Protocol):
    """What a stream reads of its fault's spec to decide its slots."""

    @property
    def kind(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def rate(self) -> float: ...


class InjectedStream:
    """Documents (anything with .index, .source, .text) plus injected ones, from the seed.

    Subclasses make the injected document (`_inject`) and may hold back injection
    (`_may_inject`), note each original (`_passed`), and keep state of their own
    (`_extra_state`, `_read_extra`, `_extra_fits`, `_set_extra`).
    """

    #: How errors name this stream's state ("not a toxic-stream state: ...").
    state_name: ClassVar[str] = "document-stream"
    #: The key of the injected documents' count in `state_dict`.
    injected_key: ClassVar[str] = "injected"

    def __init__(self, spec: SlotSpec, documents: Iterable[Any]) -> None:
        self.spec = spec
        self._documents: Iterator[Any] = iter(documents)
        self._slots = 0  # documents yielded so far, originals and injected ones
        self._originals = 0
        self._injected = 0
        self._block, self._draws = -1, [0.0]

    def __iter__(self) -> InjectedStream:
        return self

    def __next__(self) -> StreamDocument:
        slot = self._slots
        if self._may_inject() and self._draw(slot) < self.spec.rate:
            self._injected += 1
            doc = self._inject(slot)
        else:
            item = next(self._documents)  # the stream ends with its documents
            doc = StreamDocument(item.index, item.source, item.text)
            self._originals += 1
            self._passed(doc)
        self._slots += 1
        return doc

    def _draw(self, slot: int) -> float:
        """The slot's seeded draw in [0, 1)."""
        block, offset = divmod(slot, _BLOCK)
        if block != self._block:
            rng = seeded(self.spec.seed, self.spec.kind, "slots", block)
            self._block, self._draws = block, [rng.random() for _ in range(_BLOCK)]
        return self._draws[offset]

    def _may_inject(self) -> bool:
        """Whether a slot may take an injected document now."""
        return True

    def _inject(self, slot: int) -> StreamDocument:
        """Injected document number ``self._injected`` (from 1), at ``slot``."""
        raise NotImplementedError

    def _passed(self, doc: StreamDocument) -> None:
        """An original went through."""

    def _extra_state(self) -> dict[str, Any]:
        """The subclass's own part of `state_dict`."""
        return {}

    def _read_extra(self, state: dict[str, Any]) -> Any:
        """Its own part read back from ``state`` (KeyError, TypeError, ValueError: not a
        state of this stream)."""
        return None

    def _extra_fits(self, extra: Any) -> bool:
        """Whether its own part agrees with the spec."""
        return True

    def _set_extra(self, extra: Any) -> None:
        """Take its own part back."""

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: slots, originals and injected documents so far, and what the
        kind keeps besides. To resume, position a fresh documents iterator just after the
        last original this stream yielded, build a new stream on it with the same spec and
        call `load_state_dict`."""
        counts = {"slots": self._slots, "originals": self._originals}
        return {"version": 1, **counts, self.injected_key: self._injected, **self._extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s output; the documents iterator is the caller's job."""
        try:
            if state["version"] != 1:
                raise ValueError(f"unsupported version {state['version']!r}")
            counts = [int(state[k]) for k in ("slots", "originals", self.injected_key)]
            extra = self._read_extra(state)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a {self.state_name} state: {exc!r}") from None
        if counts[0] != counts[1] + counts[2] or min(counts) < 0 or not self._extra_fits(extra):
            raise ValueError(f"inconsistent {self.state_name} state: {counts}")
        self._slots, self._originals, self._injected = counts
        self._set_extra(extra)
