"""Every fault kind by name: its spec class and injector class.

The kinds are the table `faults.builtin.BUILTIN_KINDS`, read on first use rather than at
import: importing the registry (as `faults.plan` does) loads none of the kinds' modules
until something asks for a kind.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from faults.errors import FaultSpecError
from faults.injector import Injector
from faults.spec import FaultSpec


@dataclass(frozen=True, slots=True)
class FaultKind:
    """One registered kind."""

    name: str
    spec: type[FaultSpec]
    injector: type[Injector[Any]]


def kinds() -> dict[str, FaultKind]:
    """All kinds by name."""
    return dict(_kinds())


@functools.cache
def _kinds() -> dict[str, FaultKind]:
    from faults.builtin import BUILTIN_KINDS

    table: dict[str, FaultKind] = {}
    for spec, injector in BUILTIN_KINDS:
        name = spec.model_fields["kind"].default
        if not isinstance(name, str) or not name:
            raise TypeError(f"{spec.__name__}.kind needs a default naming the kind")
        if name in table:
            raise TypeError(f"fault kind {name!r} is in the table twice")
        table[name] = FaultKind(name, spec, injector)
    return table


def parse_fault(data: Any, where: str = "fault") -> FaultSpec:
    """Validate one fault given as a mapping; errors name the dotted field and expectation."""
    if not isinstance(data, dict):
        raise FaultSpecError(f"{where} must be a mapping with a 'kind', got {type(data).__name__}")
    table = kinds()
    kind = data.get("kind")
    if kind not in table:
        raise FaultSpecError(
            f"{where}.kind: unknown fault kind {kind!r}; expected one of {', '.join(sorted(table))}"
        )
    try:
        return table[kind].spec.model_validate(data)
    except ValidationError as exc:
        raise FaultSpecError(format_validation_error(exc, where)) from None


def format_validation_error(exc: ValidationError, where: str) -> str:
    """pydantic's errors as one line per problem: ``where.field: what was expected``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        path = f"{where}.{loc}" if loc else where
        lines.append(f"{path}: {err['msg']}" + (f" (got {err['input']!r})" if loc else ""))
    return "; ".join(lines)


def build_injector(spec: FaultSpec) -> Injector[Any]:
    """The injector for a validated spec."""
    return kinds()[spec.kind].injector(spec)
