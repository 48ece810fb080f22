"""The training stream: documents -> (contamination fault) -> the document stages
(duplicate filter, semantic dedup, ...) -> tokens
with the special-token layout -> fixed windows, handed out per rank per step. Its position
(a few integers, the filter's index) is saved with every checkpoint. Its settings
(`DataConfig`, the run's ``data``) name the corpus mix, the tokenizer and the layout."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from reference_trainer.corpus.corpus import SOURCE_NAMES, Corpus
from reference_trainer.corpus.mixes import mix_weights
from reference_trainer.errors import ConfigError
from reference_trainer.nested import map_leaves
from reference_trainer.stages.stage import DocumentStage
from reference_trainer.stream.batching_config import BatchingConfig
from reference_trainer.tokenizer.fallback import TokenFallback
from reference_trainer.tokenizer.keep_whole import TokenizerConfig

#: Documents tokenized together; larger batches tokenize faster, the buffer grows with it.
_ENCODE_BATCH = 16
#: A source's id in a stream's source tags (-1: unknown).
_SOURCE_IDS = {name: i for i, name in enumerate(SOURCE_NAMES)}


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """The built-in corpus, its tokenizer and the special-token layout of each document."""

    seed: int = 1234
    """Seed of the generated corpus (independent of the training seed)."""
    source_weights: dict[str, float] = field(default_factory=lambda: mix_weights("default"))
    """Share of documents drawn from each source; normalized, sources not named get 0
    (``--data-mix NAME`` sets a named mix: `reference_trainer.corpus.mixes`)."""
    tokenizer_docs: int = 1000
    """Documents from the start of the corpus used to train the BPE tokenizer."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """How the tokenizer is built beyond its size (frequent words kept whole)."""
    eot_at_start: int = 1
    """`<|endoftext|>` tokens placed before each document."""
    eot_every: int = 1024
    """Inside a document, one `<|endoftext|>` after every this many tokens (0: never)."""
    eot_at_end: int = 2
    """`<|endoftext|>` tokens placed after each document."""
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    """Dynamic batching of whole documents under a token budget (off: fixed windows)."""

    def __post_init__(self) -> None:
        for name, weight in self.source_weights.items():
            if name not in SOURCE_NAMES:
                raise ConfigError(
                    f"data.source_weights has unknown source {name!r}; "
                    f"expected some of {', '.join(SOURCE_NAMES)}"
                )
            if not (math.isfinite(weight) and weight >= 0):
                raise ConfigError(f"data.source_weights.{name} must be >= 0, got {weight}")
        if not any(w > 0 for w in self.source_weights.values()):
            raise ConfigError("data.source_weights must give at least one source a weight > 0")
        if not (isinstance(self.tokenizer_docs, int) and self.tokenizer_docs > 0):
            raise ConfigError(
                f"data.tokenizer_docs must be a positive integer, got {self.tokenizer_docs!r}"
            )
        for name in ("eot_at_start", "eot_every", "eot_at_end"):
            if getattr(self, name) < 0:
                raise ConfigError(f"data.{name} must be >= 0, got {getattr(self, name)}")


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
    #: Documents trained on, by contamination kind ("exact", "near", "paraphrase", ...).
    contaminated_kinds: dict[str, int] = field(default_factory=dict)
    #: stage -> source -> reason -> documents that stage dropped.
    dropped: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    #: stage -> injected documents among those it dropped.
    contaminated_dropped: dict[str, int] = field(default_factory=dict)

    def count_drop(self, stage: str, doc: Any, reason: str) -> None:
        """One document dropped by ``stage`` for ``reason``."""
        by_reason = self.dropped.setdefault(stage, {}).setdefault(doc.source, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if _contamination_kind(doc) is not None:
            self.contaminated_dropped[stage] = self.contaminated_dropped.get(stage, 0) + 1

    def retract(self, doc: Any) -> None:
        """A document counted as kept that a later step (the tokenizer fallback) dropped."""
        self.docs -= 1
        kind = _contamination_kind(doc)
        if kind is not None:
            self.contaminated_docs -= 1
            self.contaminated_kinds[kind] -= 1
            if not self.contaminated_kinds[kind]:
                del self.contaminated_kinds[kind]

    def count_kept(self, doc: Any) -> None:
        """One document that goes into training."""
        self.docs += 1
        kind = _contamination_kind(doc)
        if kind is not None:
            self.contaminated_docs += 1
            self.contaminated_kinds[kind] = self.contaminated_kinds.get(kind, 0) + 1


def _contamination_kind(doc: Any) -> str | None:
    """The contamination kind of an injected document, None for an original."""
    if getattr(doc, "contamination_of", None) is None:
        return None
    return str(getattr(doc, "contamination_kind", None) or "unknown")


class DocumentPipeline:
    """Corpus -> (contamination fault) -> each stage in turn: the documents to train on."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        wrap: Callable[[Iterator[Any]], StatefulStream] | None = None,
        stages: Sequence[DocumentStage] = (),
    ) -> None:
        names = [stage.name for stage in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"document stages need distinct names, got {names}")
        self.corpus = corpus
        self.wrap = wrap
        self.stages = list(stages)
        self._start(0)
        self.counters = DataCounters()

    def _start(self, position: int) -> None:
        self.reader = _CorpusReader(self.corpus, position)
        self.stream: Any = self.wrap(self.reader) if self.wrap else self.reader

    def use_corpus(self, corpus: Corpus) -> None:
        """Read the next documents from ``corpus`` (new sampling weights), same position."""
        self.corpus = self.reader.corpus = corpus

    def next_documents(self, count: int) -> list[Any]:
        """The next ``count`` documents that every stage keeps."""
        out: list[Any] = []
        while len(out) < count:
            batch = [next(self.stream) for _ in range(count - len(out))]
            for stage in self.stages:
                if not batch:
                    break
                kept = []
                for doc, verdict in zip(batch, stage.check_batch(batch), strict=True):
                    if verdict.keep:
                        kept.append(doc)
                    else:
                        self.counters.count_drop(stage.name, doc, verdict.reason)
                batch = kept
            for doc in batch:
                self.counters.count_kept(doc)
            out.extend(batch)
        return out

    def take_counters(self) -> DataCounters:
        """Counters since the last call, reset."""
        counters, self.counters = self.counters, DataCounters()
        return counters

    def state_dict(self) -> dict[str, Any]:
        """Corpus position plus the wrapper's and every stage's state."""
        state: dict[str, Any] = {"position": self.reader.position}
        if self.wrap is not None:
            state["contamination"] = self.stream.state_dict()
        state["stages"] = {stage.name: to_tensors(stage.state_dict()) for stage in self.stages}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state_dict`."""
        self._start(int(state["position"]))
        if self.wrap is not None and "contamination" in state:
            self.stream.load_state_dict(state["contamination"])
        saved = dict(state.get("stages", {}))
        if "dedup" in state:  # checkpoints written before stages had a common home
            saved.setdefault("dedup", state["dedup"])
        for stage in self.stages:
            if stage.name in saved:
                stage.load_state_dict(to_numpy(saved[stage.name]))


def to_tensors(obj: Any) -> Any:
    """numpy arrays -> tensors, recursively (checkpoints load with weights_only)."""
    return map_leaves(obj, np.ndarray, lambda a: torch.from_numpy(np.ascontiguousarray(a)))


def to_numpy(obj: Any) -> Any:
    """The inverse of `to_tensors`."""
    return map_leaves(obj, torch.Tensor, lambda t: t.numpy())


def encode_next(
    documents: DocumentPipeline, encode: Encoder, fallback: TokenFallback | None
) -> list[tuple[Any, list[int]]]:
    """The next batch of documents with their token ids; a document the tokenizer fallback
    drops is left out, and taken back out of the step's counts (it never reaches the model)."""
    docs = documents.next_documents(_ENCODE_BATCH)
    if fallback is None:
        encoded: list[list[int] | None] = list(encode([doc.text for doc in docs]))
    else:
        encoded = fallback.encode(docs, encode)
    out = []
    for doc, ids in zip(docs, encoded, strict=True):
        if ids is None:
            documents.counters.retract(doc)
        else:
            out.append((doc, ids))
    return out


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
        fallback: TokenFallback | None = None,
        tag_sources: bool = False,
    ) -> None:
        self.documents = documents
        self.encode = encode
        #: Re-tokenizes (or drops) documents with too many byte-fallback tokens.
        self.fallback = fallback
        self.layout = layout
        self.window = window
        self.windows_taken = 0
        self._buffer: list[int] = []
        self._sources: list[int] | None = [] if tag_sources else None
        self.last_sources: list[list[int]] = []

    def _refill(self) -> None:
        for doc, ids in encode_next(self.documents, self.encode, self.fallback):
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
        #: Sequences per micro-step of each rank, when not ``batch_size`` each (a straggler
        #: rebalanced: `reference_trainer.stability.straggler_shares`); they sum to
        #: ``batch_size * world_size``.
        self.shares: list[int] | None = None

    def share(self) -> int:
        """This rank's sequences per micro-step."""
        return self.batch_size if self.shares is None else self.shares[self.rank]

    def loss_weight(self) -> float:
        """What this rank's mean loss is multiplied by so that the mean over ranks (DDP's
        average of gradients) is the mean over the global batch: its share over an even
        one."""
        return self.share() / self.batch_size

    def next_step(self) -> torch.Tensor:
        """This rank's windows for one step: int64 (grad_accum, share, window)."""
        per_rank = self.batch_size * self.grad_accum
        windows = self.stream.take(per_rank * self.world_size)
        shares = self.shares or [self.batch_size] * self.world_size
        start = sum(shares[: self.rank]) * self.grad_accum
        mine = slice(start, start + shares[self.rank] * self.grad_accum)
        shape = (self.grad_accum, shares[self.rank], self.stream.window)
        if self.stream.last_sources:
            tags = self.stream.last_sources[mine]
            self.last_sources = torch.tensor(tags, dtype=torch.int64).view(shape)
        return torch.tensor(windows[mine], dtype=torch.int64).view(shape)

    def tokens_per_step(self) -> int:
        """Tokens trained on per step over all ranks (inputs, not counting the shift)."""
        return (self.stream.window - 1) * self.batch_size * self.grad_accum * self.world_size
