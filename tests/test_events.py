"""Every typed event holds exactly the fields the journal schema gives its kind, with the
schema's types: what a trainer reports cannot drift from what the oracles read."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import MISSING

import pytest

from harness.records import events
from harness.records.events import OMIT, CheckpointSaved, Detected, StepObserved
from harness.records.journal_schema import COMMON_FIELDS, EVENT_KINDS

_JSON = {"str": str, "int": int, "float": float, "bool": bool, "object": dict}


@pytest.mark.parametrize("event", events.ALL, ids=lambda e: e.kind)
def test_each_event_has_the_fields_of_its_kind(event: type[events.Reported]) -> None:
    _, spec = EVENT_KINDS[event.kind]
    own = {f.name: f for f in dataclasses.fields(event)}
    # Fields the agent adds from its own evidence are not the trainer's to report.
    agents = (
        {"params_finite", "params_fingerprint", "grads_repaired"} if event.kind == "step" else set()
    )
    assert set(own) == set(spec) - agents - set(COMMON_FIELDS)
    hints = typing.get_type_hints(event)
    for name, field in own.items():
        want = spec[name]
        has_default = field.default is not MISSING or field.default_factory is not MISSING
        assert (not has_default) == want.required, name
        hint = hints[name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        allowed = typing.get_args(hint) if union else (hint,)
        base = [t for t in allowed if t is not type(None)]
        assert [typing.get_origin(t) or t for t in base] == [_JSON[want.type]], name
        assert (type(None) in allowed) == want.nullable, name


def test_omitted_fields_are_not_written_and_none_is_written_as_null() -> None:
    assert StepObserved(loss=1.0).fields() == {"loss": 1.0}
    assert StepObserved(loss=1.0, grad_norm=None).fields() == {"loss": 1.0, "grad_norm": None}
    assert CheckpointSaved(path="p", bytes=3).fields() == {"path": "p", "bytes": 3}
    assert Detected(detector="d").fields() == {"detector": "d", "details": {}}
    assert OMIT not in StepObserved(loss=1.0).fields().values()


def test_a_misspelt_field_fails_where_it_is_written() -> None:
    with pytest.raises(TypeError):
        Detected(detecter="d")  # type: ignore[call-arg]
