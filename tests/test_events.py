"""Every journal kind is one typed event, and the schema is written from them: what a
trainer reports cannot drift from what the oracles read."""

from __future__ import annotations

import dataclasses

import pytest

from harness.records import events
from harness.records.events import OMIT, CheckpointSaved, Detected, StepObserved
from harness.records.journal_schema import COMMON_FIELDS, EVENT_KINDS


def test_every_kind_is_one_dataclass_with_a_meaning_for_each_field() -> None:
    assert [e.kind for e in events.ALL] == list(EVENT_KINDS)
    assert len({e.__name__ for e in events.ALL}) == len(events.ALL)
    for event in events.ALL:
        assert event.__doc__ and event.__doc__.strip(), event.kind
        for field in dataclasses.fields(event):
            assert field.metadata.get("doc"), f"{event.kind}.{field.name} has no doc"
            assert field.name not in COMMON_FIELDS, f"{event.kind}.{field.name} is common"


def test_the_schema_takes_types_and_nullability_from_the_annotations() -> None:
    step = EVENT_KINDS["step"][1]
    assert (step["loss"].type, step["loss"].required) == ("float", True)
    assert (step["grad_norm"].type, step["grad_norm"].nullable) == ("float", True)
    assert step["step_conflict"].type == "object" and not step["step_conflict"].required
    # A `details` written as {} by default is not required of other writers.
    assert not EVENT_KINDS["detected"][1]["details"].required
    assert EVENT_KINDS["diagnosed"][1]["layers"].type == "list"


def test_the_writer_fields_keep_their_order() -> None:
    # The JSON lines the trainer writes keep their key order (the dataclass field order).
    written = events.FileLoadFailed(path="p", error="E: x", sha256=None, api="torch.load")
    assert list(written.fields()) == ["path", "error", "sha256", "api"]
    step = StepObserved(loss=1.0, lr=0.1, skipped=False, docs=2, pad_tokens=0)
    assert list(step.fields()) == ["loss", "lr", "skipped", "docs", "pad_tokens"]


def test_omitted_fields_are_not_written_and_none_is_written_as_null() -> None:
    assert StepObserved(loss=1.0).fields() == {"loss": 1.0}
    assert StepObserved(loss=1.0, grad_norm=None).fields() == {"loss": 1.0, "grad_norm": None}
    assert CheckpointSaved(path="p", bytes=3).fields() == {"path": "p", "bytes": 3}
    assert Detected(detector="d").fields() == {"detector": "d", "details": {}}
    assert OMIT not in StepObserved(loss=1.0).fields().values()


def test_a_misspelt_field_fails_where_it_is_written() -> None:
    with pytest.raises(TypeError):
        Detected(detecter="d")  # type: ignore[call-arg]
