"""The monitoring checklist's catalogue: ``items.yaml`` read and validated, once.

Each item says what a training team should watch (``signal``, ``why``), which fault kinds
exercise it (``faults``, names of `faults.kinds`) and how a run shows it was emitted
(``evidence``: journal events, run-dir files or microscope arrays; see `Evidence`). A bad
entry is refused with its position and field, as a suite file's problems are.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from faults import kinds
from harness.errors import TightropeError
from harness.records.detectors import check_detectors
from harness.records.events import Detected
from harness.records.journal_schema import EVENT_KINDS, field_spec
from harness.run_layout import RunLayout

ITEMS_FILE = Path(__file__).with_name("items.yaml")

#: The groups, in the order the checklist lists them.
GROUPS: dict[str, str] = {
    "numerics": "Numerics: non-finite values, fp16 range, activations",
    "loss": "Loss",
    "optimizer": "Optimizer: learning rate, updates, weights",
    "layers": "Layers: gradient flow and diagnosis",
    "recovery": "Recovery",
    "checkpoints": "Checkpoints",
    "processes": "Processes and cluster",
    "data": "Data",
    "communication": "Communication",
    "throughput": "Throughput and dashboards",
    "chaos": "Chaos bookkeeping",
}

#: ``file:NAME`` evidence -> (the `RunLayout` property, a glob inside it or "" for the
#: path itself). The paths themselves live in harness/run_layout.py only.
FILE_EVIDENCE: dict[str, tuple[str, str]] = {
    "heartbeats": ("heartbeats", "rank-*.json"),
    "metrics": ("metrics", "rank-*.prom"),
    "diagnosis": ("diagnosis", ""),
    "checkpoint_manifests": ("checkpoints", "*/manifest.json"),
    "review_queue": ("review_queue", ""),
    "samples": ("samples", ""),
}

#: ``microscope.NAME`` evidence: the arrays of harness/records/microscope_file.py.
MICROSCOPE_ARRAYS = (
    "grad_norm",
    "weight_norm",
    "update_ratio",
    "act_hist",
    "allreduce_ms",
    "probe_us",
)

_EVENT = re.compile(r"^(?P<kind>[a-z_]+)(?:\[(?P<key>[a-z_]+)=(?P<value>[A-Za-z0-9_.-]+)\])?$")


class ChecklistError(TightropeError):
    """The catalogue, or what the checklist was pointed at, is not usable."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One way a run shows an item: a journal event, a run-dir file or a microscope array."""

    source: Literal["journal", "file", "microscope"]
    #: journal: the event kind; file: a `FILE_EVIDENCE` name; microscope: an array name.
    name: str
    #: journal only: the field path that must be present and not null (``*``: any key of
    #: an object), and a field that must hold a given value.
    path: tuple[str, ...] = ()
    match: tuple[str, str] | None = None
    text: str = ""

    def __str__(self) -> str:
        return self.text


def parse_evidence(text: str) -> Evidence:
    """One evidence string as ``items.yaml`` writes it; ValueError says what is wrong."""
    if text.startswith("file:"):
        name = text.removeprefix("file:")
        if name not in FILE_EVIDENCE:
            raise ValueError(f"unknown file {name!r}; expected one of {', '.join(FILE_EVIDENCE)}")
        return Evidence("file", name, text=text)
    if text.startswith("microscope."):
        name = text.removeprefix("microscope.")
        if name not in MICROSCOPE_ARRAYS:
            raise ValueError(
                f"unknown microscope array {name!r}; expected one of {', '.join(MICROSCOPE_ARRAYS)}"
            )
        return Evidence("microscope", name, text=text)
    head, _, rest = text.partition(".")
    found = _EVENT.match(head)
    if found is None or found["kind"] not in EVENT_KINDS:
        raise ValueError(
            f"{text!r} is not file:NAME, microscope.ARRAY, none, nor a journal event kind "
            f"(KIND, KIND.FIELD or KIND[FIELD=VALUE]; kinds: {', '.join(EVENT_KINDS)})"
        )
    kind = found["kind"]
    path = tuple(rest.split(".")) if rest else ()
    for name in (path[:1] if path else ()) + ((found["key"],) if found["key"] else ()):
        if field_spec(kind, name) is None:
            raise ValueError(f"{text!r}: events of kind {kind!r} have no field {name!r}")
    match = (found["key"], found["value"]) if found["key"] else None
    if kind == Detected.kind and match is not None and match[0] == "detector":
        check_detectors(match[1])
    return Evidence("journal", kind, path=path, match=match, text=text)


class Item(BaseModel):
    """One monitoring item of the checklist."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", max_length=48)
    title: str = Field(min_length=3)
    group: str
    signal: str = Field(min_length=10, description="What is measured, precisely.")
    why: str = Field(min_length=20, description="Why it matters, one or two sentences.")
    faults: list[str] = Field(description="Fault kinds that exercise it ([] when none does).")
    #: Any one of these shows it was emitted; empty: `evidence: none`, never emitted.
    evidence: tuple[Evidence, ...]

    @field_validator("group")
    @classmethod
    def _known_group(cls, value: str) -> str:
        if value not in GROUPS:
            raise ValueError(f"unknown group {value!r}; expected one of {', '.join(GROUPS)}")
        return value

    @field_validator("faults")
    @classmethod
    def _known_faults(cls, value: list[str]) -> list[str]:
        known = kinds()
        unknown = [k for k in value if k not in known]
        if unknown:
            raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; see `tightrope faults`")
        if len(set(value)) != len(value):
            raise ValueError("a fault kind is listed twice")
        return value

    @field_validator("evidence", mode="before")
    @classmethod
    def _parse_evidence(cls, value: Any) -> Any:
        if value == "none":
            return ()
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("expected none, one evidence string or a non-empty list of them")
        return tuple(parse_evidence(t) for t in texts)

    @property
    def showable(self) -> bool:
        """This project can show the item today (its evidence is not ``none``)."""
        return bool(self.evidence)

    def evidence_text(self) -> str:
        """The evidence as ``items.yaml`` writes it."""
        return " or ".join(str(e) for e in self.evidence) if self.evidence else "none"


def parse_catalogue(data: Any, source: str = "items.yaml") -> tuple[Item, ...]:
    """Validate a catalogue's data; every problem named with its entry and field at once."""
    if not isinstance(data, list):
        raise ChecklistError(f"{source}: expected a list of items")
    problems: list[str] = []
    items: list[Item] = []
    for i, entry in enumerate(data):
        name = entry.get("name", f"#{i}") if isinstance(entry, dict) else f"#{i}"
        try:
            items.append(Item.model_validate(entry))
        except ValidationError as exc:
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"])
                problems.append(f"{source}: item {i} ({name}).{where}: {err['msg']}")
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            problems.append(f"{source}: two items are named {item.name!r}")
        seen.add(item.name)
    if problems:
        raise ChecklistError("; ".join(problems))
    return tuple(items)


@functools.cache
def catalogue() -> tuple[Item, ...]:
    """Every item of ``items.yaml``, in file order."""
    data = yaml.safe_load(ITEMS_FILE.read_text(encoding="utf-8"))
    return parse_catalogue(data, str(ITEMS_FILE.name))


def file_paths(run_dir: Path, name: str) -> list[Path]:
    """The files of a run directory that ``file:NAME`` evidence stands for (those there)."""
    attribute, pattern = FILE_EVIDENCE[name]
    base: Path = getattr(RunLayout(run_dir), attribute)
    if not pattern:
        return [base] if base.is_file() else []
    return sorted(p for p in base.glob(pattern) if p.is_file()) if base.is_dir() else []
