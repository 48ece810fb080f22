"""Tokenizer stress: tagged stress documents of each kind at the asked rate, seeded and
resumable, and a spec that refuses what it cannot honour."""

from __future__ import annotations

import itertools
import json
import random
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from faults import FaultPlan
from faults.errors import FaultSpecError
from faults.injector import StepContext
from faults.registry import kinds, parse_fault
from faults.tokenizer_stress import (
    STRESS_KINDS,
    StressedStream,
    TokenizerStressInjector,
    TokenizerStressSpec,
    stress_text,
)
from harness.inside.agent import Agent


@dataclass(frozen=True)
class Doc:
    index: int
    source: str
    text: str


DOCS = [Doc(i, ("code", "social_chatter")[i % 2], f"plain document {i} here") for i in range(6000)]


def spec(**fields: Any) -> TokenizerStressSpec:
    return TokenizerStressSpec.model_validate({"at_step": 1, **fields})


def test_stress_documents_come_at_the_rate_tagged_and_originals_in_order() -> None:
    out = list(StressedStream(spec(rate=0.1, seed=3), iter(DOCS)))
    stressed = [d for d in out if d.contamination_kind == "tokenizer_stress"]
    originals = [d for d in out if d.contamination_kind is None]
    assert [d.index for d in originals] == list(range(len(DOCS)))  # none lost, in order
    assert 0.08 < len(stressed) / len(out) < 0.12
    assert [d.index for d in stressed] == list(range(-1, -len(stressed) - 1, -1))
    assert all(d.contamination_of is None for d in stressed)  # it copies nothing
    assert out[0].contamination_kind is None
    for prev, doc in itertools.pairwise(out):  # a stress document has its stream's source
        if doc.contamination_kind:
            assert doc.source in ("code", "social_chatter")
            if not prev.contamination_kind:
                assert doc.source == prev.source


@pytest.mark.parametrize("kind", STRESS_KINDS)
def test_each_kind_holds_what_it_says(kind: Any) -> None:
    text = stress_text(kind, 200, random.Random(1))
    if kind == "scripts":
        assert sum(not c.isascii() for c in text) > len(text) / 3
    elif kind == "digits":
        runs = [w for w in text.split() if w.isdigit()]
        assert runs and min(len(r) for r in runs) >= 100
    elif kind == "control":
        assert sum(unicodedata.category(c) == "Cc" for c in text) >= 200
    else:
        assert any(0xDC80 <= ord(c) <= 0xDCFF for c in text) and "\ufffd" in text


def test_only_the_asked_kinds_are_drawn() -> None:
    out = list(StressedStream(spec(rate=0.3, kinds=["digits"], seed=1), iter(DOCS[:600])))
    stressed = [d.text for d in out if d.contamination_kind]
    assert stressed and all(any(w.isdigit() and len(w) >= 100 for w in t.split()) for t in stressed)


def test_deterministic_from_the_seed() -> None:
    def run(seed: int) -> list[Any]:
        return list(StressedStream(spec(rate=0.1, seed=seed), iter(DOCS[:2000])))

    assert run(9) == run(9)
    assert run(9) != run(10)


def test_state_dict_round_trip_continues_identically() -> None:
    s = spec(rate=0.1, seed=5)
    first = StressedStream(s, iter(DOCS))
    head = list(itertools.islice(first, 2000))
    state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint keeps it
    assert state["originals"] + state["stressed"] == state["slots"] == 2000
    resumed = StressedStream(s, iter(DOCS[state["originals"] :]))
    resumed.load_state_dict(state)
    tail = list(itertools.islice(resumed, 2000))
    assert tail == list(itertools.islice(first, 2000))
    assert head + tail == list(itertools.islice(StressedStream(s, iter(DOCS)), 4000))
    assert any(d.contamination_kind for d in tail)
    with pytest.raises(ValueError, match="tokenizer-stress stream state"):
        resumed.load_state_dict({"version": 1, "slots": 3})
    with pytest.raises(ValueError, match="inconsistent"):
        resumed.load_state_dict({**state, "slots": state["slots"] + 1})


def test_spec_validation_and_registration() -> None:
    assert kinds()["tokenizer_stress"].spec.fault_class == "data"
    for bad, field in [
        ({"rate": 0.6}, "rate"),
        ({"rate": 0.0001}, "rate"),
        ({"rate": 0.1, "kinds": []}, "kinds"),
        ({"rate": 0.1, "kinds": ["klingon"]}, "kinds"),
        ({"rate": 0.1, "words": 2}, "words"),
        ({"rate": 0.1, "length": 3}, "length"),
        ({}, "rate"),
    ]:
        fault = {"kind": "tokenizer_stress", "at_step": 1, **bad}
        with pytest.raises(FaultSpecError, match=rf"plan\.faults\[0\]\.{field}"):
            parse_fault(fault, "plan.faults[0]")


@pytest.mark.parametrize("when", [{"every": 3}, {"probability": 0.5}, {"after_seconds": 2.0}])
def test_a_trigger_the_stream_cannot_honour_is_refused_naming_it(when: dict[str, Any]) -> None:
    field = next(iter(when))
    with pytest.raises(FaultSpecError, match=rf"plan\.faults\[0\]\.{field}: .*honours at_step"):
        parse_fault({"kind": "tokenizer_stress", "rate": 0.1, **when}, "plan.faults[0]")


def test_step_hooks_do_nothing_and_wrap_documents_builds_the_stream() -> None:
    injector = TokenizerStressInjector(spec(rate=0.1))
    assert injector.spec.reach == "documents"
    assert injector.end_step(StepContext(step=1, rank=0, world_size=1)) == []
    out = list(itertools.islice(injector.wrap_documents(DOCS), 100))
    assert out == list(itertools.islice(StressedStream(injector.spec, iter(DOCS)), 100))


def test_the_agent_refuses_it_beside_another_stream_fault(tmp_path: Path) -> None:
    stress = {"kind": "tokenizer_stress", "at_step": 1, "rate": 0.1}
    copies = {"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05}
    one = Agent(tmp_path / "a", plan=FaultPlan.from_dict({"faults": [stress]}), control=False)
    one.start(0)
    wrap = one.document_wrapper()
    assert wrap is not None and isinstance(wrap(iter(DOCS)), StressedStream)
    one.close("completed")
    plan = FaultPlan.from_dict({"faults": [stress, copies]})
    two = Agent(tmp_path / "b", plan=plan, control=False)
    two.start(0)
    with pytest.raises(FaultSpecError, match="not several"):
        two.document_wrapper()
    two.close("completed")
