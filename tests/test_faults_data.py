"""Duplicate contamination: tagged copies of real corpus documents at the asked rate."""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.data import (
    ContaminatedStream,
    DuplicateContaminationInjector,
    DuplicateContaminationSpec,
    StreamDocument,
    near_duplicate,
)
from faults.errors import FaultSpecError
from faults.injector import StepContext
from faults.registry import kinds, parse_fault
from reference_trainer.corpus.corpus import Corpus, Document

N = 20_000
# The cheaper sources (technical_docs is the slowest to generate); still three styles.
WEIGHTS = {"social_chatter": 2.0, "product_reviews": 2.0, "code": 1.0}


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    return list(itertools.islice(Corpus(WEIGHTS, seed=7).documents(), N))


def spec(**fields: Any) -> DuplicateContaminationSpec:
    return DuplicateContaminationSpec.model_validate({"at_step": 1, **fields})


def word_distance(a: list[str], b: list[str], limit: int) -> int:
    """Word-level Levenshtein distance, or limit + 1 when it exceeds ``limit`` (banded)."""
    while a and b and a[0] == b[0]:
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    inf = limit + 1
    prev = {j: j for j in range(min(len(b), limit) + 1)}
    for i in range(1, len(a) + 1):
        cur: dict[int, int] = {}
        for j in range(max(0, i - limit), min(len(b), i + limit) + 1):
            if j == 0:
                cur[j] = i
                continue
            cur[j] = min(
                inf,
                prev.get(j, inf) + 1,
                cur.get(j - 1, inf) + 1,
                prev.get(j - 1, inf) + (a[i - 1] != b[j - 1]),
            )
        prev = cur
    return prev.get(len(b), inf)


def check_stream(
    out: list[StreamDocument], docs: list[Document], s: DuplicateContaminationSpec
) -> list[StreamDocument]:
    """Originals unchanged and in order; copies tagged, numbered and faithful to the spec."""
    originals = [d for d in out if d.contamination_of is None]
    assert [(d.index, d.source, d.text) for d in originals] == [
        (d.index, d.source, d.text) for d in docs[: len(originals)]
    ]
    assert all(d.contamination_kind is None for d in originals)
    copies = [d for d in out if d.contamination_of is not None]
    assert [d.index for d in copies] == [-(k + 1) for k in range(len(copies))]
    sources = [d for d in docs if s.source in (None, d.source)][: s.pool]
    for copy in copies:
        assert copy.contamination_of is not None
        original = docs[copy.contamination_of]
        assert original in sources and copy.source == original.source
        if copy.contamination_kind == "exact":
            assert copy.text.encode() == original.text.encode()
        else:
            assert copy.contamination_kind == "near"
            assert copy.text.split() != original.text.split()
            assert word_distance(copy.text.split(), original.text.split(), s.edits) <= s.edits
    return copies


@pytest.mark.parametrize("rate", [0.001, 0.01, 0.05])
def test_contamination_rate_and_faithful_copies(docs: list[Document], rate: float) -> None:
    s = spec(rate=rate, seed=1)
    out = list(ContaminatedStream(s, iter(docs)))
    copies = check_stream(out, docs, s)
    n = len(out)
    assert n == N + len(copies)
    sigma = math.sqrt(n * rate * (1 - rate))
    assert abs(len(copies) - n * rate) <= 4 * sigma + 1, (len(copies), n * rate)
    assert {c.contamination_kind for c in copies} == {"exact", "near"}


@pytest.mark.parametrize(("near_fraction", "edits"), [(0.0, 2), (0.2, 1), (0.8, 5), (1.0, 3)])
def test_near_fraction_and_edits(docs: list[Document], near_fraction: float, edits: int) -> None:
    s = spec(rate=0.05, near_fraction=near_fraction, edits=edits, seed=2)
    copies = check_stream(list(ContaminatedStream(s, iter(docs[:6000]))), docs, s)
    near = sum(c.contamination_kind == "near" for c in copies)
    sigma = math.sqrt(len(copies) * near_fraction * (1 - near_fraction))
    assert abs(near - len(copies) * near_fraction) <= 4 * sigma


def test_source_and_pool_restrict_the_originals_copied(docs: list[Document]) -> None:
    s = spec(rate=0.05, source="code", pool=3, seed=4)
    copies = check_stream(list(ContaminatedStream(s, iter(docs[:5000]))), docs, s)
    firsts = [d.index for d in docs if d.source == "code"][:3]
    assert {c.contamination_of for c in copies} == set(firsts)


def test_deterministic_from_the_seed(docs: list[Document]) -> None:
    def run(seed: int) -> list[StreamDocument]:
        return list(ContaminatedStream(spec(rate=0.05, seed=seed), iter(docs[:4000])))

    assert run(9) == run(9)
    assert run(9) != run(10)


def test_state_dict_round_trip_continues_identically(docs: list[Document]) -> None:
    s = spec(rate=0.05, seed=5)
    first = ContaminatedStream(s, iter(docs))
    head = list(itertools.islice(first, 3000))
    state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint keeps it
    assert state["originals"] + state["copies"] == state["slots"] == 3000
    assert state["last_index"] == state["originals"] - 1
    resumed = ContaminatedStream(s, iter(docs[state["originals"] :]))
    resumed.load_state_dict(state)
    tail = list(itertools.islice(resumed, 3000))
    assert tail == list(itertools.islice(first, 3000))
    assert head + tail == list(itertools.islice(ContaminatedStream(s, iter(docs)), 6000))
    assert any(d.contamination_of is not None for d in tail)
    with pytest.raises(ValueError, match="contaminated-stream state"):
        resumed.load_state_dict({"version": 1, "slots": 3})


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(st.sampled_from(["a", "b", "cd", "x1", "λ"]), max_size=12),
    seps=st.lists(st.sampled_from([" ", "\n", "  ", "\t "]), min_size=13, max_size=13),
    edge=st.sampled_from(["", " ", "\n"]),
    edits=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_near_duplicate_edits(
    words: list[str], seps: list[str], edge: str, edits: int, seed: int
) -> None:
    text = edge + "".join(w + s for w, s in zip(words, seps, strict=False)).rstrip() + edge
    out = near_duplicate(text, edits, random.Random(seed))
    assert out.split() != text.split()
    assert word_distance(out.split(), text.split(), edits) <= edits


def test_spec_validation_and_registration() -> None:
    assert kinds()["duplicate_contamination"].spec.fault_class == "data"
    for bad, field in [
        ({"rate": 0.5}, "rate"),
        ({"rate": 0.0001}, "rate"),
        ({"rate": 0.01, "edits": 6}, "edits"),
        ({"rate": 0.01, "near_fraction": 1.5}, "near_fraction"),
        ({"rate": 0.01, "pool": 0}, "pool"),
        ({"rate": 0.01, "duplicates": 3}, "duplicates"),
        ({}, "rate"),
    ]:
        fault = {"kind": "duplicate_contamination", "at_step": 1, **bad}
        with pytest.raises(FaultSpecError, match=rf"plan\.faults\[0\]\.{field}:"):
            parse_fault(fault, "plan.faults[0]")


def test_step_hooks_do_nothing_and_wrap_documents_builds_the_stream(docs: list[Document]) -> None:
    injector = DuplicateContaminationInjector(spec(rate=0.05))
    assert injector.spec.reach == "documents"
    assert injector.end_step(StepContext(step=1, rank=0, world_size=1)) == []
    out = list(itertools.islice(injector.wrap_documents(docs), 100))
    assert out == list(itertools.islice(ContaminatedStream(injector.spec, iter(docs)), 100))


@pytest.mark.parametrize(
    "when", [{"every": 3}, {"probability": 0.5}, {"after_seconds": 2.0}, {"at_step": 1, "every": 2}]
)
def test_a_trigger_the_stream_cannot_honour_is_refused_naming_it(when: dict[str, Any]) -> None:
    field = next(k for k in when if k != "at_step")
    with pytest.raises(FaultSpecError, match=rf"plan\.faults\[0\]\.{field}: .*honours at_step"):
        parse_fault({"kind": "duplicate_contamination", **when}, "plan.faults[0]")
