"""Deterministic synthetic corpus: six styles of English-ish text mixed by weight."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from reference_trainer.corpus.sources import GENERATORS as _GENERATORS

#: New sources go at the end: a source's place decides which documents a seeded draw picks,
#: so appending (at weight 0 in the default mix) leaves every existing corpus unchanged.
SOURCE_NAMES: tuple[str, ...] = (
    "technical_docs",
    "social_chatter",
    "product_reviews",
    "code",
    "web",
    "encyclopedia",
)


# ---------------------------------------------------------------- public API
@dataclass(frozen=True, slots=True)
class Document:
    """One document of the corpus stream."""

    index: int
    source: str
    text: str


def generate_text(source: str, seed: int, index: int) -> str:
    """One document's text from one source; a pure function of its arguments."""
    gen = _GENERATORS.get(source)
    if gen is None:
        raise ValueError(f"unknown source {source!r}; valid sources: {', '.join(SOURCE_NAMES)}")
    # String seeds are hashed with sha512, so they are stable across processes and versions.
    return gen(random.Random(f"{source}:{seed}:{index}"))


class Corpus:
    """An endless, deterministic stream of documents mixed by per-source weights."""

    __slots__ = ("_cumulative", "_seed", "_sources", "_weights")

    def __init__(self, weights: Mapping[str, float], seed: int) -> None:
        valid = f"valid sources: {', '.join(SOURCE_NAMES)}"
        clean: dict[str, float] = {}
        for key, value in weights.items():
            if key not in SOURCE_NAMES:
                raise ValueError(f"unknown source {key!r} in weights; {valid}")
            try:
                weight = float(value)
            except (TypeError, ValueError):
                weight = math.nan
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(
                    f"weight for {key!r} must be finite and >= 0, got {value!r}; {valid}"
                )
            clean[key] = weight
        top = max(clean.values(), default=0.0)
        if not top > 0:
            raise ValueError(
                f"at least one weight must be positive, got {dict(weights)!r}; {valid}"
            )
        # Scaling by the largest weight first keeps huge weights from overflowing the sum.
        total = sum(w / top for w in clean.values())
        self._seed = seed
        self._weights = {s: clean.get(s, 0.0) / top / total for s in SOURCE_NAMES}
        # SOURCE_NAMES order (not the mapping's), so equal weights always give equal corpora.
        self._sources = tuple(s for s in SOURCE_NAMES if self._weights[s] > 0)
        self._cumulative = tuple(itertools.accumulate(self._weights[s] for s in self._sources))

    def __repr__(self) -> str:
        return f"Corpus(weights={self._weights!r}, seed={self._seed!r})"

    def reweighted(self, weights: Mapping[str, float]) -> Corpus:
        """The same corpus (seed) drawing its sources by other weights."""
        return Corpus(weights, self._seed)

    def document(self, index: int) -> Document:
        """The document at `index`: a pure function of (weights, seed, index)."""
        if index < 0:
            raise ValueError(f"document index must be >= 0, got {index}")
        u = random.Random(f"{self._seed}:{index}").random() * self._cumulative[-1]
        # min() guards the rounding edge where u lands exactly on the last boundary.
        source = self._sources[
            min(bisect.bisect_right(self._cumulative, u), len(self._sources) - 1)
        ]
        return Document(index, source, generate_text(source, self._seed, index))

    def documents(self, start: int = 0) -> Iterator[Document]:
        """document(start), document(start + 1), ... without end."""
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        return (self.document(i) for i in itertools.count(start))
