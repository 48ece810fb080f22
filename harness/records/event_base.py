"""What every typed journal event is made of: the `Reported` base, the `OMIT` default of a
field not observed, and the helpers that give each field its one-line meaning.

A kind's class docstring is the kind's meaning and each field's ``doc`` its own; the
schema (`harness.records.journal_schema`) and docs/journal.md are written from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


#: The default of an optional field: not written at all.
OMIT: Any = _Omit()


def required(doc: str) -> Any:
    """A field every event of the kind carries."""
    return field(metadata={"doc": doc})


def optional(doc: str) -> Any:
    """A field written only when set (left at `OMIT`: not observed, not written)."""
    return field(default=OMIT, metadata={"doc": doc})


def free_form(doc: str = "The figures behind the event, by name (free-form).") -> Any:
    """The free-form ``details`` object, written as ``{}`` when nothing is given."""
    return field(default_factory=dict, metadata={"doc": doc})


@dataclass(frozen=True, slots=True, kw_only=True)
class Reported:
    """One journal event's own fields; ``kind`` names the event."""

    kind: ClassVar[str]

    def fields(self) -> dict[str, Any]:
        """The fields to journal (those left at `OMIT` are not written)."""
        values = ((name, getattr(self, name)) for name in _names(type(self)))
        return {name: value for name, value in values if value is not OMIT}


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(kind: type[Reported]) -> tuple[str, ...]:
    names = _NAMES.get(kind)
    if names is None:
        names = _NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return names
