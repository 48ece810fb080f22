"""Semantic dedup: the stage after the hash filter, for copies that say the same thing in
other words (paraphrases), which exact digests and MinHash of word n-grams let through.

Method (docs/data.md has the measured figures). Embedding every document would cost about
26 ms each on one core, so the stage first finds *candidates* cheaply and embeds only those:

1. Candidates. Each document's set of lowercased words (``\\w+``) gets a ``num_perm``-entry
   MinHash (64-bit blake2b word hashes, ``(a*x + b) mod p`` as in the hash filter). A document
   is a candidate when some kept document *of the same source* has an estimated word-set
   Jaccard >= ``candidate_jaccard``. A paraphrase that swaps synonyms and reorders sentences
   keeps most of its words (names, numbers, nouns) but few of its word 3-grams, so it stays
   a candidate while the hash filter misses it; unrelated documents of one source share
   fewer words. The comparison is a vectorized scan of the source's signatures.
2. Verification. A candidate and its best-matching kept documents (at most
   ``max_partners``) are embedded with all-MiniLM-L6-v2 (`embeddings.SentenceEmbedder`,
   loaded on the first candidate: a run without one never loads it), on the first
   ``prefix_chars`` characters (the model reads 128 word pieces, fewer than that). A
   look-ahead over the batch finds every text its decisions may need and embeds them in
   one call (1.4-2.8x faster than one at a time here; the vectors differ by ~1e-7). The
   candidate is dropped as "paraphrase" when its cosine similarity to one of them is >= the
   threshold of its source (``thresholds``, else ``default_threshold``): 0.85 for technical
   documents, 0.7 for social chatter, as the design gives them.

Kept documents are indexed (FIFO, at most ``max_docs``), with their text prefix, so a kept
document's vector is computed only when it first becomes a partner, and kept after that.
Verdicts depend only on the sequence of documents seen, and the index (signatures, ids,
sources, prefixes, the vectors computed so far) is the stage's state, so a resumed run
decides exactly as the run it continues. Matches are only ever between documents that share
words: a paraphrase in other words entirely (another language, say) is not a candidate.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from reference_trainer.stages.embeddings import DIM, SentenceEmbedder
from reference_trainer.stages.stage import KEPT, StageVerdict

_P = 2**32 - 5  # prime: a*x + b < 2**64 for x, a, b < 2**32, so uint64 arithmetic is exact
_WORDS = re.compile(r"\w+")
_DROPPED = StageVerdict(keep=False, reason="paraphrase")

#: The design's thresholds: technical text repeats its vocabulary, so a copy must be closer.
DEFAULT_THRESHOLDS = {
    "technical_docs": 0.85,
    "social_chatter": 0.7,
    "product_reviews": 0.85,
    "code": 0.9,
}


@dataclass(kw_only=True, slots=True)
class SemanticDedupConfig:
    """Settings of the semantic dedup stage; ``enabled=False`` keeps every document."""

    enabled: bool = True
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    """Cosine similarity at or above which a candidate is a copy, per source."""
    default_threshold: float = 0.85
    """The threshold of a source not named in ``thresholds``."""
    candidate_jaccard: float = 0.55
    """Estimated word-set Jaccard with a kept document of its source that makes a candidate."""
    num_perm: int = 128
    """MinHash entries per word set (the estimate's std is about 0.04 at these values)."""
    max_partners: int = 3
    """Kept documents a candidate is compared with, the most word-similar first."""
    prefix_chars: int = 1000
    """Characters of a document that are embedded (and kept in the index)."""
    max_docs: int = 10_000
    """Index capacity; the oldest kept documents are evicted first."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"semantic_dedup.enabled must be a bool (got {self.enabled!r})")
        for name, value in {**self.thresholds, "default_threshold": self.default_threshold}.items():
            where = "default_threshold" if name == "default_threshold" else f"thresholds.{name}"
            if not _fraction(value):
                raise ValueError(f"semantic_dedup.{where} must be in (0, 1] (got {value!r})")
        if not _fraction(self.candidate_jaccard):
            got = self.candidate_jaccard
            raise ValueError(f"semantic_dedup.candidate_jaccard must be in (0, 1] (got {got!r})")
        for name in ("num_perm", "max_partners", "prefix_chars", "max_docs", "seed"):
            value, low = getattr(self, name), 0 if name == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"semantic_dedup.{name} must be an int >= {low} (got {value!r})")

    def threshold(self, source: str) -> float:
        """The cosine threshold of ``source``."""
        return self.thresholds.get(source, self.default_threshold)


def _fraction(value: Any) -> bool:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return ok and math.isfinite(value) and 0.0 < value <= 1.0


class SemanticDedupStage:
    """Drops documents whose meaning repeats a kept document of the same source."""

    name = "semantic_dedup"

    def __init__(self, config: SemanticDedupConfig, embedder: SentenceEmbedder | None = None):
        self.config = config
        self.embedder = embedder or SentenceEmbedder()
        rng = np.random.default_rng(config.seed)
        self._a = rng.integers(1, _P, size=config.num_perm, dtype=np.uint64)
        self._b = rng.integers(0, _P, size=config.num_perm, dtype=np.uint64)
        self._reset()
        self._prefetched: dict[str, npt.NDArray[np.float32]] = {}
        self.candidates = 0  # documents that were compared by meaning

    def _reset(self) -> None:
        self._sigs = np.zeros((0, self.config.num_perm), dtype=np.uint32)
        self._sources: list[str] = []
        self._ids: list[int] = []
        self._texts: list[str] = []
        self._vectors: list[npt.NDArray[np.float32] | None] = []

    # ------------------------------------------------------------------ pieces
    def _signature(self, text: str) -> npt.NDArray[np.uint32]:
        words = set(_WORDS.findall(text.lower())) or {""}
        hashes = np.fromiter(
            (
                int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                for w in words
            ),
            dtype=np.uint64,
            count=len(words),
        )
        x = hashes % np.uint64(_P)
        y = (np.multiply.outer(self._a, x) + self._b[:, None]) % np.uint64(_P)
        sig: npt.NDArray[np.uint32] = y.min(axis=1).astype(np.uint32)
        return sig

    def _partners(self, sig: npt.NDArray[np.uint32], source: str) -> list[int]:
        """Slots of kept documents of ``source`` similar enough in words, most similar first."""
        if not len(self._sigs):
            return []
        same = np.fromiter(
            (s == source for s in self._sources), dtype=bool, count=len(self._sources)
        )
        equal = np.count_nonzero(self._sigs == sig, axis=1) / self.config.num_perm
        hits = np.flatnonzero(same & (equal >= self.config.candidate_jaccard))
        # Most similar first; ties to the older entry, so the order survives a resume.
        order = sorted(hits.tolist(), key=lambda slot: (-equal[slot], slot))
        return order[: self.config.max_partners]

    def _vector(self, text: str) -> npt.NDArray[np.float32]:
        vector = self._prefetched.get(text)
        if vector is None:  # a partner the look-ahead did not foresee (rare)
            vector = self._prefetched[text] = self.embedder.encode([text])[0]
        return vector

    def _prefetch(self, documents: Sequence[Any], texts: list[str], sigs: list[Any]) -> None:
        """Embed in one batch every text this batch's decisions may need: each document
        with a partner (in the index, or earlier in the batch) and its partners' texts."""
        needed: dict[str, None] = {}
        for i, (doc, text, sig) in enumerate(zip(documents, texts, sigs, strict=True)):
            slots = self._partners(sig, doc.source)
            earlier = [
                j
                for j in range(i)
                if documents[j].source == doc.source
                and np.count_nonzero(sigs[j] == sig) / self.config.num_perm
                >= self.config.candidate_jaccard
            ]
            if not slots and not earlier:
                continue
            needed[text] = None
            needed.update((self._texts[s], None) for s in slots if self._vectors[s] is None)
            needed.update((texts[j], None) for j in earlier)
        if needed:
            order = list(needed)
            self._prefetched = dict(zip(order, self.embedder.encode(order), strict=True))

    def _add(self, doc: Any, sig: npt.NDArray[np.uint32], text: str, vec: Any) -> None:
        if len(self._ids) >= self.config.max_docs:  # FIFO: the oldest kept entry goes
            self._sigs = self._sigs[1:]
            del self._sources[0], self._ids[0], self._texts[0], self._vectors[0]
        self._sigs = np.concatenate([self._sigs, sig[None, :]])
        self._sources.append(doc.source)
        self._ids.append(int(doc.index))
        self._texts.append(text)
        self._vectors.append(vec)

    # ------------------------------------------------------------------ the stage
    def check_batch(self, documents: Sequence[Any]) -> list[StageVerdict]:
        """Drop a document when it means what a kept one of its source means; index the rest."""
        if not self.config.enabled:
            return [KEPT] * len(documents)
        texts = [doc.text[: self.config.prefix_chars] for doc in documents]
        sigs = [self._signature(text) for text in texts]
        self._prefetch(documents, texts, sigs)
        out = []
        for doc, text, sig in zip(documents, texts, sigs, strict=True):
            partners = self._partners(sig, doc.source)
            vec = None
            if partners:
                self.candidates += 1
                vec = self._vector(text)
                threshold = self.config.threshold(doc.source)
                best = -1.0
                for slot in partners:
                    partner = self._vectors[slot]
                    if partner is None:
                        partner = self._vectors[slot] = self._vector(self._texts[slot])
                    best = max(best, float(np.dot(vec, partner)))
                if best >= threshold:
                    out.append(_DROPPED)
                    continue
            self._add(doc, sig, text, vec)
            out.append(KEPT)
        self._prefetched = {}
        return out

    def state_dict(self) -> dict[str, Any]:
        """The index, oldest first: numpy arrays and plain values."""
        texts = [t.encode("utf-8", "surrogatepass") for t in self._texts]
        has = [v is not None for v in self._vectors]
        vectors = [v for v in self._vectors if v is not None]
        names = sorted(set(self._sources))
        return {
            "version": 1,
            "num_perm": self.config.num_perm,
            "prefix_chars": self.config.prefix_chars,
            "perm_a": self._a.copy(),
            "perm_b": self._b.copy(),
            "signatures": self._sigs.copy(),
            "doc_ids": np.asarray(self._ids, dtype=np.int64),
            "source_names": names,
            "sources": np.asarray([names.index(s) for s in self._sources], dtype=np.int64),
            "text_bytes": np.frombuffer(b"".join(texts), dtype=np.uint8).copy(),
            "text_lengths": np.asarray([len(t) for t in texts], dtype=np.int64),
            "has_vector": np.asarray(has, dtype=bool),
            "vectors": np.asarray(vectors, dtype=np.float32).reshape(-1, DIM),
            "candidates": self.candidates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict`; the signature-shaping settings must match."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported semantic dedup state version {state.get('version')!r}")
        for name in ("num_perm", "prefix_chars"):
            if int(state[name]) != getattr(self.config, name):
                raise ValueError(
                    f"semantic_dedup.{name} is {getattr(self.config, name)} but the state has "
                    f"{int(state[name])}; its index would not be comparable"
                )
        self._a = np.asarray(state["perm_a"], dtype=np.uint64).copy()
        self._b = np.asarray(state["perm_b"], dtype=np.uint64).copy()
        sigs = np.asarray(state["signatures"], dtype=np.uint32)
        lengths = np.asarray(state["text_lengths"], dtype=np.int64).tolist()
        blob = np.asarray(state["text_bytes"], dtype=np.uint8).tobytes()
        names = list(state["source_names"])
        sources = np.asarray(state["sources"], dtype=np.int64).tolist()
        has = np.asarray(state["has_vector"], dtype=bool).tolist()
        vectors = iter(np.asarray(state["vectors"], dtype=np.float32))
        if not (len(sigs) == len(lengths) == len(sources) == len(has)):
            raise ValueError("inconsistent semantic dedup state: index arrays differ in length")
        self._reset()
        self._sigs = sigs.copy()
        self._ids = np.asarray(state["doc_ids"], dtype=np.int64).tolist()
        self._sources = [names[i] for i in sources]
        ends = np.cumsum([0, *lengths]).tolist()
        self._texts = [
            blob[lo:hi].decode("utf-8", "surrogatepass") for lo, hi in itertools.pairwise(ends)
        ]
        self._vectors = [next(vectors).copy() if h else None for h in has]
        self.candidates = int(state["candidates"])
