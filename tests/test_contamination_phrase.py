"""The contamination's phrase: every copy begins with it verbatim; unset, nothing changes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from faults.data import ContaminatedStream, DuplicateContaminationSpec
from faults.errors import FaultSpecError
from faults.registry import parse_fault
from reference_trainer.corpus.corpus import Corpus, Document

PHRASE = "Ten stars, buy it now"
WEIGHTS = {"social_chatter": 1.0, "product_reviews": 1.0}


def _docs(n: int = 2000) -> list[Document]:
    return list(itertools.islice(Corpus(WEIGHTS, seed=3).documents(), n))


def _spec(**fields: Any) -> DuplicateContaminationSpec:
    base = {"at_step": 1, "rate": 0.05, "pool": 4}
    return DuplicateContaminationSpec.model_validate({**base, **fields})


def test_every_copy_begins_with_the_phrase_even_a_near_duplicate() -> None:
    docs = _docs()
    out = list(ContaminatedStream(_spec(phrase=PHRASE, near_fraction=0.5), docs))
    copies = [d for d in out if d.contamination_of is not None]
    assert {d.contamination_kind for d in copies} == {"exact", "near"}
    assert all(d.text.startswith(PHRASE + " ") for d in copies)
    originals = {d.index: d.text for d in docs}
    exact = [d for d in copies if d.contamination_kind == "exact"]
    assert all(d.text == f"{PHRASE} {originals[d.contamination_of]}" for d in exact)  # type: ignore[index]
    # Originals never carry it: the phrase marks the contamination alone.
    assert not any(PHRASE in d.text for d in out if d.contamination_of is None)


def test_without_a_phrase_the_stream_is_unchanged() -> None:
    docs = _docs()
    plain = [d.text for d in ContaminatedStream(_spec(), docs)]
    marked = [d.text for d in ContaminatedStream(_spec(phrase=PHRASE), docs)]
    assert len(plain) == len(marked)
    changed = [(a, b) for a, b in zip(plain, marked, strict=True) if a != b]
    assert changed and all(b == f"{PHRASE} {a}" for a, b in changed)


def test_a_resumed_stream_goes_on_with_the_same_marked_copies() -> None:
    docs = _docs()
    spec = _spec(phrase=PHRASE, near_fraction=0.5)
    whole = [d.text for d in ContaminatedStream(spec, docs)]
    first = ContaminatedStream(spec, docs)
    head = [next(first).text for _ in range(700)]
    state = first.state_dict()
    rest_docs = [d for d in docs if d.index > state["last_index"]]
    second = ContaminatedStream(spec, rest_docs)
    second.load_state_dict(state)
    assert head + [d.text for d in second] == whole


@pytest.mark.parametrize("bad", ["", "   ", "x" * 201])
def test_a_blank_or_huge_phrase_is_refused_naming_the_field(bad: str) -> None:
    fault = {"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05, "phrase": bad}
    with pytest.raises(FaultSpecError, match=r"plan\.faults\[0\]\.phrase"):
        parse_fault(fault, "plan.faults[0]")
