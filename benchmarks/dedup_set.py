"""A labelled near-duplicate stream and its scoring, for ``benchmarks/dedup.py`` and the tests.

The stream: ``originals`` documents of the project's corpus generator, each cut to its first
``words`` words (documents shorter than that are passed over), with ``copies`` injected
copies at seeded random slots. A copy repeats an original already in the stream: exact with
probability ``exact_fraction`` (the same words, in other case), otherwise a near copy with
1 to ``max_edits`` word edits by the contamination fault's own ``near_duplicate``. The label
of a document is whether it is a copy; a filter's call is whether it drops it as a duplicate
of an earlier document.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from faults.data import near_duplicate
from reference_trainer.corpus.corpus import Corpus

WEIGHTS = {"technical_docs": 1, "social_chatter": 1, "product_reviews": 1, "code": 1}
COPY_ID = 1_000_000  # ids of copies: COPY_ID + copy number, far from the corpus indices


@dataclass(frozen=True, slots=True)
class LabelledDoc:
    """One document of the stream; ``source`` is the original's id for a copy, else None."""

    doc_id: int
    text: str
    source: int | None
    edits: int  # word edits of a near copy; 0 for exact copies and originals


@dataclass(frozen=True, slots=True)
class Scores:
    """Precision, recall and F1 of "this document duplicates an earlier one"."""

    predicted: int
    true_positives: int
    copies: int
    precision: float
    recall: float
    f1: float


def labelled_stream(
    originals: int = 5000,
    copies: int = 1000,
    *,
    words: int = 88,
    exact_fraction: float = 0.3,
    max_edits: int = 6,
    seed: int = 0,
) -> list[LabelledDoc]:
    """``originals + copies`` documents in stream order; a pure function of the arguments."""
    corpus = Corpus(WEIGHTS, seed)
    texts: list[str] = []
    index = 0
    while len(texts) < originals:
        split = corpus.document(index).text.split()
        index += 1
        if len(split) >= words:
            texts.append(" ".join(split[:words]))
    rng = random.Random(f"dedup-set:{seed}")
    total = originals + copies
    copy_slots = set(rng.sample(range(1, total), copies))  # slot 0 is always an original
    out: list[LabelledDoc] = []
    seen = 0  # originals emitted so far
    for slot in range(total):
        if slot not in copy_slots:
            out.append(LabelledDoc(seen, texts[seen], None, 0))
            seen += 1
            continue
        source = rng.randrange(seen)
        number = COPY_ID + len(out) - seen
        if rng.random() < exact_fraction:
            out.append(LabelledDoc(number, texts[source].upper(), source, 0))
        else:
            edits = rng.randint(1, max_edits)
            text = near_duplicate(texts[source], edits, rng)
            out.append(LabelledDoc(number, text, source, edits))
    return out


def shingles(text: str, size: int = 3) -> list[str]:
    """Word ``size``-grams of the lowercased words, as our filter forms them (a document
    shorter than that is one shingle)."""
    words = text.lower().split()
    if len(words) < size:
        return [" ".join(words)] if words else []
    return [" ".join(words[i : i + size]) for i in range(len(words) - size + 1)]


def true_jaccard(stream: Sequence[LabelledDoc], size: int = 3) -> list[float]:
    """Exact Jaccard of each copy's shingle set with its source's, in stream order."""
    text = {doc.doc_id: doc.text for doc in stream if doc.source is None}
    out = []
    for doc in stream:
        if doc.source is not None:
            a, b = set(shingles(doc.text, size)), set(shingles(text[doc.source], size))
            out.append(len(a & b) / len(a | b))
    return out


def score(stream: Sequence[LabelledDoc], dropped: Sequence[bool]) -> Scores:
    """Scores of one filter's calls (True = dropped as a duplicate), in stream order."""
    if len(dropped) != len(stream):
        raise ValueError(f"{len(dropped)} calls for {len(stream)} documents")
    copies = sum(doc.source is not None for doc in stream)
    predicted = sum(dropped)
    tp = sum(d and doc.source is not None for doc, d in zip(stream, dropped, strict=True))
    precision = tp / predicted if predicted else 0.0
    recall = tp / copies if copies else 0.0
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return Scores(predicted, tp, copies, precision, recall, f1)
