"""The journal's event schema: every kind, its fields, their types and meaning.

This table is the contract between whatever writes a journal (the reference trainer,
the agent attached to someone else's trainer) and whatever judges it (the oracles). It is
written from the event dataclasses (`harness.records.events`), each kind declared once
there; the kind table of docs/journal.md is written from it (`kinds_markdown`), and a
test keeps the page equal to it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from harness.records.event_base import Reported
from harness.records.events import ALL

#: Bumped when a field changes meaning or a required field is added. Readers refuse
#: journals written with a newer version than they know.
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of an event: its JSON type, whether it must be present, what it means."""

    type: str  # "int", "float", "str", "bool", "object", "list"
    doc: str
    required: bool = False
    nullable: bool = False

    def accepts(self, value: Any) -> bool:
        """True when ``value`` has this field's type (``None`` only where nullable)."""
        if value is None:
            return self.nullable
        if self.type == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.type == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, _PYTHON_TYPES[self.type])


_PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "bool": bool,
    "object": dict,
    "list": list,
}

#: Fields every event carries, written by the journal writer itself.
COMMON_FIELDS: MappingProxyType[str, FieldSpec] = MappingProxyType(
    {
        "v": FieldSpec("int", "Schema version the line was written with.", required=True),
        "kind": FieldSpec("str", "Event kind, one of the kinds below.", required=True),
        "wall": FieldSpec("float", "Wall-clock time, seconds since the epoch.", required=True),
        "mono": FieldSpec(
            "float",
            "Monotonic clock, seconds; comparable between processes on one host only.",
            required=True,
        ),
        "rank": FieldSpec("int", "Global rank of the writing process.", required=True),
        "restart": FieldSpec(
            "int",
            "How many times the launcher had restarted the workers when this was written "
            "(torchrun's restart count; 0 for the first attempt).",
            required=True,
        ),
        "step": FieldSpec(
            "int",
            "Optimizer steps completed when the event happened. In a `step` event, the "
            "step it reports: the first training step is 1.",
            required=True,
        ),
    }
)


#: JSON type of a field by the outer type of its annotation.
_JSON_TYPES = {int: "int", float: "float", str: "str", bool: "bool", dict: "object", list: "list"}


def _field_spec(event: type[Reported], item: dataclasses.Field[Any], hint: Any) -> FieldSpec:
    """One dataclass field of an event as the schema states it."""
    args = typing.get_args(hint)
    nullable = isinstance(hint, types.UnionType) and type(None) in args
    outer = next(a for a in args if a is not type(None)) if nullable else hint
    json_type = _JSON_TYPES.get(typing.get_origin(outer) or outer)
    if json_type is None:
        raise TypeError(f"{event.__name__}.{item.name}: no JSON type for {hint!r}")
    no_default = item.default is dataclasses.MISSING
    required = no_default and item.default_factory is dataclasses.MISSING
    return FieldSpec(json_type, item.metadata["doc"], required=required, nullable=nullable)


def _schema(event: type[Reported]) -> tuple[str, MappingProxyType[str, FieldSpec]]:
    """(meaning, own fields) of an event kind, from its dataclass."""
    hints = typing.get_type_hints(event)
    own = {f.name: _field_spec(event, f, hints[f.name]) for f in dataclasses.fields(event)}
    return " ".join((event.__doc__ or "").split()), MappingProxyType(own)


#: Kind -> its own fields (beyond the common ones), with a one-line meaning of the kind;
#: written from the event dataclasses of `harness.records.events`.
EVENT_KINDS: MappingProxyType[str, tuple[str, MappingProxyType[str, FieldSpec]]] = MappingProxyType(
    {event.kind: _schema(event) for event in ALL}
)


def field_spec(kind: str, name: str) -> FieldSpec | None:
    """The spec of field ``name`` in events of ``kind``; None when there is no such field."""
    if name in COMMON_FIELDS:
        return COMMON_FIELDS[name]
    entry = EVENT_KINDS.get(kind)
    return entry[1].get(name) if entry else None


def kinds_markdown() -> str:
    """The kind sections of docs/journal.md: each kind's meaning and a table of its fields."""
    sections = []
    for kind, (meaning, fields) in EVENT_KINDS.items():
        rows = [
            f"| `{name}` | {spec.type}{' or null' if spec.nullable else ''} | "
            f"{'yes' if spec.required else ''} | {spec.doc} |"
            for name, spec in fields.items()
        ]
        table = ["| field | type | required | meaning |", "|---|---|---|---|", *rows]
        sections.append(f"### `{kind}`\n\n{meaning}\n\n" + "\n".join(table) + "\n")
    return "\n".join(sections)
