"""The values of a spec field that break guards most often, declared on the field itself.

A kind marks each field that property tests should vary with a `Bias`, as an ``Annotated``
extra (validation and the JSON schema ignore it)::

    fraction: Annotated[float, Bias((1.0, 1e-9))] = Field(default=1.0, gt=0, le=1)

`harness.suites.strategies` derives every kind's strategy from these marks and the field's
own type and bounds: the biased values as often as the rest of the valid range (a
``Literal``'s choices, an integer or float range capped at ``upto``), or the biased values
alone with ``only``; a value ``apart`` is a branch of its own. Fields without a mark keep
their defaults; ``target`` is always drawn from the caller's globs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Bias:
    """How a property test draws one field."""

    #: The values that hurt most, drawn half of the time.
    values: tuple[Any, ...] = ()
    #: The top of the range drawn otherwise, where the field's own bound is far off or none.
    upto: float | None = None
    #: Draw the biased values only (a field of names, where any other is just a miss).
    only: bool = False
    #: A value that is a case apart (no grace period at all), drawn as often as the rest.
    apart: tuple[Any, ...] = ()
    #: The bottom of the range drawn, excluded, where it differs from the field's own.
    above: float | None = None
