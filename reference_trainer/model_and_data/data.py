"""The training stream: documents -> (contamination fault) -> duplicate filter -> tokens
with the special-token layout -> fixed windows, handed out per rank per step. Its position
(a few integers, the filter's index) is saved with every checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from reference_trainer.config import DataConfig
from reference_trainer.model_and_data.corpus import SOURCE_NAMES, Corpus
from reference_trainer.model_and_data.dedup import DuplicateFilter
from reference_trainer.model_and_data.nested import map_leaves

#: Documents tokenized together; larger batches tokenize faster, the buffer grows with it.
_ENCODE_BATCH = 16
#: A source's id in a stream's source tags (-1: unknown).
_SOURCE_IDS = {name: i for i, name in enumerate(SOURCE_NAMES)}


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """Where `<|endoftext|>` goes: before, inside (every N tokens) and after a document."""

    eot_id: int
    at_start: int = 1
    every: int = 1024
    at_end: int = 2

    @classmethod
    def from_config(cls, cfg: DataConfig, eot_id: int) -> TokenLayout:
        """The layout a data configuration asks for."""
        return cls(eot_id, cfg.eot_at_start, cfg.eot_every, cfg.eot_at_end)

    def wrap(self, body: Sequence[int]) -> list[int]:
        """A document's token ids with the layout's `<|endoftext|>` tokens in place."""
        out = [self.eot_id] * self.at_start
        every = self.every or len(body) or 1
        for start in range(0, len(body), every):
            if start:
                out.append(self.eot_id)
            out.extend(body[start : start + every])
        out.extend([self.eot_id] * self.at_end)
        return out


Encoder = Callable[[list[str]], list[list[int]]]


class _CorpusReader:
    """Corpus documents in order, counting how many were read (the resume position)."""

    def __init__(self, corpus: Corpus, start: int) -> None:
        self.corpus = corpus
        self.position = start

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        doc = self.corpus.document(self.position)
        self.position += 1
        return doc


class StatefulStream(Protocol):
    """A document iterator that can save and restore its position (a contamination wrapper)."""

    def __next__(self) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(slots=True)
class DataCounters:
    """What went into the stream since the last `take_counters`."""

    docs: int = 0
    contaminated_docs: int = 0
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> reason -> n
    contaminated_dropped: int = 0


class DocumentPipeline:
    """Corpus -> (contamination fault) -> (duplicate filter): the documents to train on."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        wrap: Callable[[Iterator[Any]], StatefulStream] | None = None,
        dedup: DuplicateFilter | None = None,
    ) -> None:
        self.corpus = corpus
        self.wrap = wrap
        self.dedup = dedup
        self._start(0)
        self.counters = DataCounters()

    def _start(self, position: int) -> None:
        self.reader = _CorpusReader(self.corpus, position)
        self.stream: Any = self.wrap(self.reader) if self.wrap else self.reader

    def use_corpus(self, corpus: Corpus) -> None:
        """Read the next documents from ``corpus`` (new sampling weights), same position."""
        self.corpus = self.reader.corpus = corpus

    def next_documents(self, count: int) -> list[Any]:
        """The next ``count`` documents that pass the filter."""
        out: list[Any] = []
        while len(out) < count:
            doc = next(self.stream)
            tainted = getattr(doc, "contamination_of", None) is not None
            if self.dedup is not None:
                verdict = self.dedup.check(doc.index, doc.text)
                if not verdict.keep:
                    by_reason = self.counters.dropped.setdefault(doc.source, {})
                    by_reason[verdict.reason] = by_reason.get(verdict.reason, 0) + 1
                    self.counters.contaminated_dropped += tainted
                    continue
            self.counters.docs += 1
            self.counters.contaminated_docs += tainted
            out.append(doc)
        return out

    def take_counters(self) -> DataCounters:
        """Counters since the last call, reset."""
        counters, self.counters = self.counters, DataCounters()
        return counters

    def state_dict(self) -> dict[str, Any]:
        """Corpus position plus the wrapper's and the filter's state."""
        state: dict[str, Any] = {"position": self.reader.position}
        if self.wrap is not None:
            state["contamination"] = self.stream.state_dict()
        if self.dedup is not None:
            state["dedup"] = to_tensors(self.dedup.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state_dict`."""
        self._start(int(state["position"]))
        if self.wrap is not None and "contamination" in state:
            self.stream.load_state_dict(state["contamination"])
        if self.dedup is not None and "dedup" in state:
            self.dedup.load_state_dict(to_numpy(state["dedup"]))


def to_tensors(obj: Any) -> Any:
    """numpy arrays -> tensors, recursively (checkpoints load with weights_only)."""
    return map_leaves(obj, np.ndarray, lambda a: torch.from_numpy(np.ascontiguousarray(a)))


def to_numpy(obj: Any) -> Any:
    """The inverse of `to_tensors`."""
    return map_leaves(obj, torch.Tensor, lambda t: t.numpy())


class TokenStream:
    """Endless windows of ``window`` tokens cut, back to back, from the documents in order.

    With ``tag_sources``, a parallel buffer holds each token's source id (its index in
    `SOURCE_NAMES`), and `last_sources` the ids of the windows `take` returned last.
    """

    def __init__(
        self,
        documents: DocumentPipeline,
        encode: Encoder,
        layout: TokenLayout,
        window: int,
        *,
        tag_sources: bool = False,
    ) -> None:
        self.documents = documents
        self.encode = encode
        self.layout = layout
        self.window = window
        self.windows_taken = 0
        self._buffer: list[int] = []
        self._sources: list[int] | None = [] if tag_sources else None
        self.last_sources: list[list[int]] = []

    def _refill(self) -> None:
        docs = self.documents.next_documents(_ENCODE_BATCH)
        for doc, ids in zip(docs, self.encode([doc.text for doc in docs]), strict=True):
            tokens = self.layout.wrap(ids)
            self._buffer.extend(tokens)
            if self._sources is not None:
                self._sources.extend([_SOURCE_IDS.get(doc.source, -1)] * len(tokens))

    def take(self, count: int) -> list[list[int]]:
        """The next ``count`` windows."""
        need = count * self.window
        while len(self._buffer) < need:
            self._refill()
        out = [self._buffer[i * self.window : (i + 1) * self.window] for i in range(count)]
        del self._buffer[:need]
        if self._sources is not None:
            tags = self._sources
            self.last_sources = [
                tags[i * self.window : (i + 1) * self.window] for i in range(count)
            ]
            del tags[:need]
        self.windows_taken += count
        return out

    def skip(self, count: int) -> None:
        """Pass over ``count`` windows without training on them."""
        self.take(count)

    def state_dict(self) -> dict[str, Any]:
        """Position in the stream: enough to continue exactly where it stopped."""
        state: dict[str, Any] = {
            "documents": self.documents.state_dict(),
            "windows_taken": self.windows_taken,
            "buffer": torch.tensor(self._buffer, dtype=torch.int64),
        }
        if self._sources is not None:
            state["sources"] = torch.tensor(self._sources, dtype=torch.int8)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state_dict`."""
        self.documents.load_state_dict(state["documents"])
        self.windows_taken = int(state["windows_taken"])
        self._buffer = [int(t) for t in state["buffer"].tolist()]
        if self._sources is not None:  # saved untagged: the buffered tokens' sources unknown
            saved = state.get("sources")
            tags = [int(t) for t in saved.tolist()] if saved is not None else []
            self._sources = tags if len(tags) == len(self._buffer) else [-1] * len(self._buffer)


class ShardedLoader:
    """Each optimizer step takes the next global batch of windows from the stream; a rank
    keeps its contiguous share, split into micro-batches.

    The window order does not depend on the number of ranks, so world size W with
    accumulation A sees the same global batch as world size 1 with accumulation W*A.
    """

    def __init__(
        self, stream: TokenStream, *, batch_size: int, grad_accum: int, rank: int, world_size: int
    ) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.rank = rank
        self.world_size = world_size
        #: Each token's source id in the last `next_step` (a tagging stream only).
        self.last_sources: torch.Tensor | None = None

    def next_step(self) -> torch.Tensor:
        """This rank's windows for one step: int64 (grad_accum, batch_size, window)."""
        per_rank = self.batch_size * self.grad_accum
        windows = self.stream.take(per_rank * self.world_size)
        mine = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        shape = (self.grad_accum, self.batch_size, self.stream.window)
        if self.stream.last_sources:
            tags = self.stream.last_sources[mine]
            self.last_sources = torch.tensor(tags, dtype=torch.int64).view(shape)
        return torch.tensor(windows[mine], dtype=torch.int64).view(shape)

    def tokens_per_step(self) -> int:
        """Tokens trained on per step over all ranks (inputs, not counting the shift)."""
        return (self.stream.window - 1) * self.batch_size * self.grad_accum * self.world_size
