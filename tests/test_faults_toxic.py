"""toxic_contamination: seeded, tagged toxic posts at the asked rate, none of them the
classifier's training texts, and a stream that resumes exactly where it stopped."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from faults import FaultSpecError, build_injector, kinds, parse_fault
from faults.data import StreamDocument
from faults.toxic import ToxicContaminationSpec, ToxicStream, toxic_text
from harness.suites.strategies import fault_plans
from reference_trainer.corpus.corpus import Corpus, Document
from reference_trainer.stages.toxicity_corpus import labelled_set

DOCUMENT_KINDS = sorted(n for n, k in kinds().items() if k.spec.reach == "documents")
WEIGHTS = {"technical_docs": 1.0, "social_chatter": 1.0, "product_reviews": 1.0, "code": 1.0}


def spec(**fields: Any) -> ToxicContaminationSpec:
    return ToxicContaminationSpec.model_validate({"at_step": 1, **fields})


def take(stream: ToxicStream, n: int) -> list[StreamDocument]:
    return [next(stream) for _ in range(n)]


def test_posts_are_tagged_at_the_rate_and_originals_pass_unchanged() -> None:
    corpus = Corpus(WEIGHTS, 0)
    out = take(ToxicStream(spec(rate=0.1, seed=3), corpus.documents()), 2000)
    toxic = [d for d in out if d.contamination_kind == "toxic"]
    assert 140 < len(toxic) < 260  # 10% of 2000, binomial sd ~13
    assert [d.index for d in toxic] == list(range(-1, -len(toxic) - 1, -1))
    originals = [d for d in out if d.contamination_kind is None]
    assert [d.index for d in originals] == list(range(len(originals)))
    assert all(d.text == corpus.document(d.index).text for d in originals[:50])
    assert all(d.contamination_of is not None and d.source == "social_chatter" for d in toxic)


def test_same_seed_same_stream_other_seed_other_posts() -> None:
    corpus = Corpus(WEIGHTS, 0)
    first = take(ToxicStream(spec(rate=0.2, seed=5), corpus.documents()), 300)
    again = take(ToxicStream(spec(rate=0.2, seed=5), corpus.documents()), 300)
    other = take(ToxicStream(spec(rate=0.2, seed=6), corpus.documents()), 300)
    assert first == again and first != other


def test_resume_continues_exactly() -> None:
    corpus = Corpus(WEIGHTS, 0)
    s = spec(rate=0.15, seed=9)
    whole = take(ToxicStream(s, corpus.documents()), 400)
    head = ToxicStream(s, corpus.documents())
    take(head, 170)
    state = head.state_dict()
    resumed = ToxicStream(s, corpus.documents(state["originals"]))
    resumed.load_state_dict(state)
    assert take(resumed, 230) == whole[170:]


def test_a_torn_state_is_refused() -> None:
    stream = ToxicStream(spec(rate=0.1), [])
    with pytest.raises(ValueError, match="toxic-stream state"):
        stream.load_state_dict({"version": 1, "slots": 3})
    with pytest.raises(ValueError, match="inconsistent"):
        stream.load_state_dict(
            {"version": 1, "slots": 5, "originals": 1, "injected": 1, "last_index": 0}
        )


def test_the_fault_texts_are_not_the_classifier_training_texts() -> None:
    train = {item.text.lower() for item in labelled_set("train", 1, 1600)}
    posts = {toxic_text(seed, k, 0.3).lower() for seed in range(3) for k in range(1, 200)}
    assert not train & posts


def test_bad_parameters_name_the_field() -> None:
    for bad in ({"rate": 0.5}, {"rate": 0.1, "context": 2}, {"rate": 0.1, "every": 3}):
        with pytest.raises(FaultSpecError, match=next(iter(set(bad) - {"rate"}), "rate")):
            parse_fault({"kind": "toxic_contamination", "at_step": 1, **bad}, "plan.faults[0]")
    assert kinds()["toxic_contamination"].spec.reach == "documents"
    injector = build_injector(
        parse_fault({"kind": "toxic_contamination", "at_step": 1, "rate": 0.1})
    )
    docs = [Document(i, "code", f"x = {i}") for i in range(5)]
    assert [d.index for d in injector.wrap_documents(docs) if d.index >= 0][:3] == [0, 1, 2]


@settings(max_examples=25, deadline=None)
@given(fault_plans(kinds=DOCUMENT_KINDS, max_faults=4))
def test_a_drawn_plan_holds_one_documents_fault_at_most(plan: Any) -> None:
    assert sum(s.kind in DOCUMENT_KINDS for s in plan) <= 1
    assert all(s.at_step == 1 for s in plan)
