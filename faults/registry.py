"""Every fault kind by name: its spec class and injector class."""

from __future__ import annotations

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


_REGISTRY: dict[str, FaultKind] = {}


def register(spec: type[FaultSpec], injector: type[Injector[Any]]) -> None:
    """Add a kind; its name is the default of the spec's ``kind`` field."""
    name = spec.model_fields["kind"].default
    if not isinstance(name, str) or not name:
        raise TypeError(f"{spec.__name__}.kind needs a default naming the kind")
    if name in _REGISTRY and _REGISTRY[name].spec is not spec:
        raise TypeError(f"fault kind {name!r} is registered twice")
    _REGISTRY[name] = FaultKind(name, spec, injector)


def kinds() -> dict[str, FaultKind]:
    """All registered kinds by name, built-in ones loaded."""
    _load_builtins()
    return dict(_REGISTRY)


def _load_builtins() -> None:
    # Imported for their register() calls; here rather than at the top so that a module
    # defining a kind can import this one.
    import faults.builtin  # noqa: F401


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
