"""The synthetic corpus: reproducible, correctly mixed, varied, and strict about weights."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.corpus.corpus import SOURCE_NAMES, Corpus, Document, generate_text

ROOT = Path(__file__).resolve().parents[1]
EQUAL = {name: 1.0 for name in SOURCE_NAMES}
SEED = 1234

_SUBPROCESS_SCRIPT = """
import json, sys
from reference_trainer.corpus.corpus import Corpus
corpus = Corpus(json.loads(sys.argv[1]), int(sys.argv[2]))
docs = [corpus.document(i) for i in json.loads(sys.argv[3])]
print(json.dumps([[d.index, d.source, d.text] for d in docs]))
"""


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[i : i + 5]) for i in range(len(words) - 4)}


def _max_pairwise_jaccard(texts: list[str]) -> float:
    """Largest Jaccard similarity between the word 5-gram sets of any two texts."""
    sets = [_shingles(t) for t in texts]
    df = Counter(g for s in sets for g in s)
    # Only shingles held by two or more texts can contribute to an intersection.
    column = {g: j for j, g in enumerate(g for g, c in df.items() if c > 1)}
    incidence = np.zeros((len(sets), len(column)), dtype=np.float32)
    for i, s in enumerate(sets):
        incidence[i, [column[g] for g in s if g in column]] = 1.0
    inter = (incidence @ incidence.T).astype(np.float64)
    sizes = np.array([len(s) for s in sets], dtype=np.float64)
    union = np.maximum(sizes[:, None] + sizes[None, :] - inter, 1.0)
    jaccard = inter / union
    np.fill_diagonal(jaccard, 0.0)
    return float(jaccard.max())


def test_same_documents_in_a_fresh_process_and_other_seed_differs() -> None:
    indices = [0, 1, 2, 17, 999, 123_456]
    corpus = Corpus(EQUAL, SEED)
    here = [[d.index, d.source, d.text] for d in map(corpus.document, indices)]
    # A different hash seed in the child exposes any dependence on hash() or set order.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "4242"}
    args = [json.dumps(EQUAL), str(SEED), json.dumps(indices)]
    result = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_SCRIPT, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(result.stdout) == here

    other = Corpus(EQUAL, SEED + 1)
    for i in indices:
        assert other.document(i).text != corpus.document(i).text
    for source in SOURCE_NAMES:
        assert generate_text(source, SEED, 5) != generate_text(source, SEED + 1, 5)


def test_random_access_equals_streaming() -> None:
    corpus = Corpus({"technical_docs": 1, "social_chatter": 2, "code": 3}, SEED)
    n = 300
    streamed = list(islice(corpus.documents(0), n))
    assert [d.index for d in streamed] == list(range(n))
    for i in (0, 1, 57, 150, n - 1):
        assert corpus.document(i) == streamed[i]
    assert list(islice(corpus.documents(120), 30)) == streamed[120:150]
    # A fresh instance, asked out of order, agrees too: no hidden iteration state.
    fresh = Corpus({"code": 3, "technical_docs": 1, "social_chatter": 2}, SEED)
    assert [fresh.document(i) for i in reversed(range(n))] == streamed[::-1]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(-(2**63), 2**63), index=st.integers(0, 10**12))
def test_any_index_is_reachable_directly(seed: int, index: int) -> None:
    weights = {"social_chatter": 1.0, "product_reviews": 1.0}
    doc = Corpus(weights, seed).document(index)
    assert doc == Corpus(weights, seed).document(index)
    assert doc.index == index
    assert doc.source in weights
    assert doc.text == generate_text(doc.source, seed, index)


def test_sources_are_mixed_by_weight() -> None:
    weights = {"technical_docs": 0.5, "social_chatter": 0.3, "product_reviews": 0.2}
    n = 5000
    counts = Counter(d.source for d in islice(Corpus(weights, SEED).documents(), n))
    assert "code" not in counts
    for source, weight in weights.items():
        assert abs(counts[source] / n - weight) < 0.03, (source, counts[source] / n)


def test_weights_are_normalized_and_zero_weight_sources_never_appear() -> None:
    a = Corpus({"social_chatter": 1.0, "code": 3.0}, SEED)
    b = Corpus({"code": 30.0, "social_chatter": 10.0, "technical_docs": 0.0}, SEED)
    docs = list(islice(a.documents(), 400))
    assert docs == list(islice(b.documents(), 400))
    assert {d.source for d in docs} == {"social_chatter", "code"}


@pytest.mark.parametrize("source", SOURCE_NAMES)
def test_every_source_gives_ascii_text_with_digits(source: str) -> None:
    texts = [generate_text(source, SEED, i) for i in range(200)]
    assert all(t.strip() for t in texts)
    assert all(t.isascii() for t in texts)
    with_digits = sum(any(c.isdigit() for c in t) for t in texts)
    assert with_digits >= 0.8 * len(texts)


@pytest.mark.parametrize("source", SOURCE_NAMES)
def test_documents_are_not_near_duplicates(source: str) -> None:
    texts = [generate_text(source, SEED, i) for i in range(400)]
    assert len(set(texts)) == len(texts)
    assert _max_pairwise_jaccard(texts) < 0.5


def test_near_duplicate_check_detects_near_duplicates() -> None:
    text = generate_text("social_chatter", SEED, 0)
    others = [generate_text("social_chatter", SEED, i) for i in range(1, 5)]
    assert _max_pairwise_jaccard([*others, text, text + " lol same"]) > 0.5


def test_document_lengths_match_their_style() -> None:
    tech = [
        len(d.text.split()) for d in islice(Corpus({"technical_docs": 1}, SEED).documents(), 200)
    ]
    assert all(150 <= n <= 2500 for n in tech)
    assert any(n > 1200 for n in tech)  # long enough to exceed a 1024-token context
    assert sum(n <= 600 for n in tech) >= 0.85 * len(tech)
    social = [len(generate_text("social_chatter", SEED, i).split()) for i in range(200)]
    assert all(20 <= n <= 120 for n in social)
    reviews = [len(generate_text("product_reviews", SEED, i).split()) for i in range(200)]
    assert all(40 <= n <= 250 for n in reviews)
    code = [len(generate_text("code", SEED, i).splitlines()) for i in range(200)]
    assert all(10 <= n <= 60 for n in code)


def test_style_markers_of_each_source() -> None:
    tech = generate_text("technical_docs", SEED, 0)
    assert tech.startswith("# ") and "\n## " in tech
    posts = " ".join(generate_text("social_chatter", SEED, i) for i in range(50))
    assert "@" in posts and "#" in posts
    review = generate_text("product_reviews", SEED, 0)
    assert "/5 stars" in review and "$" in review and "Pros:" in review and "Cons:" in review
    code = [generate_text("code", SEED, i) for i in range(200)]
    assert all("def " in c and "return " in c and "\n    " in c for c in code)
    for c in code:
        ast.parse(c)  # code documents are real Python, not just Python-looking


@pytest.mark.parametrize(
    ("weights", "mentioned"),
    [
        ({"technical_docs": 1.0, "tech_docs": 1.0}, "tech_docs"),
        ({"social_chatter": -0.5}, "-0.5"),
        ({"code": 1.0, "social_chatter": -0.5}, "-0.5"),
        ({"code": math.nan}, "nan"),
        ({"code": math.inf}, "inf"),
        ({"code": 0.0, "product_reviews": 0}, "code"),
        ({}, "positive"),
    ],
)
def test_bad_weights_are_rejected(weights: dict[str, float], mentioned: str) -> None:
    with pytest.raises(ValueError) as err:
        Corpus(weights, SEED)
    assert mentioned in str(err.value)
    assert all(name in str(err.value) for name in SOURCE_NAMES)


def test_bad_source_or_index_is_rejected() -> None:
    with pytest.raises(ValueError, match="podcasts"):
        generate_text("podcasts", SEED, 0)
    with pytest.raises(ValueError):
        Corpus(EQUAL, SEED).document(-1)
    with pytest.raises(ValueError):
        Corpus(EQUAL, SEED).documents(-5)


def test_documents_are_immutable_values() -> None:
    doc = Corpus(EQUAL, SEED).document(3)
    assert isinstance(doc, Document)
    with pytest.raises(AttributeError):
        doc.text = "edited"  # type: ignore[misc]
