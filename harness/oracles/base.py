"""What every oracle shares: how it is built from its expectation and how it words a `Check`.

An oracle with a ``name`` of its own is a check: declaring the class registers it
(`registered`), with the `Expectation` it takes under ``expect:``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, TypeVar

from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence, Figure

OracleT = TypeVar("OracleT", bound="ExpectOracle")

#: Significant digits kept in a reported float: enough to compare, few enough to read.
SIGNIFICANT = 4


def rounded(value: Figure) -> Figure:
    """A figure as reported: floats to 4 significant digits, non-finite ones as text."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if not math.isfinite(value):
        # The scorecard is JSON, which has no NaN or infinity (the journal's encoding).
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value.is_integer():
        # Whole numbers (loss scales, step counts) are exact; rounding would only blur them.
        return value
    return float(f"{value:.{SIGNIFICANT}g}")


class ExpectOracle(ABC):
    """Base of the oracles: built from the value of its key under ``expect:``. A subclass
    with a ``name`` of its own is a check, registered by being declared (`registered`)."""

    #: The check's name, the same as its key under ``expect:`` in a scenario.
    name: ClassVar[str]
    #: What the check takes under ``expect:``, and how the docs describe it.
    expectation: ClassVar[Expectation]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "name" in own and not isinstance(own.get("expectation"), Expectation):
            raise TypeError(f"check {cls.__name__} ({own['name']!r}) declares no expectation")

    @classmethod
    def from_expect(cls: type[OracleT], value: Any) -> OracleT:
        """The oracle for ``value``, the scenario's expectation for this check."""
        # Checks that are plain flags (``params_finite: true``) take no parameter.
        return cls()

    @abstractmethod
    def judge(self, evidence: Evidence) -> Check:
        """The verdict of this check on ``evidence``."""

    def verdict(
        self,
        passed: bool,
        figure: Figure,
        *,
        unit: str,
        expected: str,
        detail: str,
        **figures: Figure,
    ) -> Check:
        """A `Check` of this oracle, its figures rounded for reading."""
        return Check(
            name=self.name,
            passed=passed,
            figure=rounded(figure),
            unit=unit,
            expected=expected,
            detail=detail,
            figures={key: rounded(value) for key, value in figures.items()},
        )

    def not_judged(self, detail: str, *, unit: str, expected: str, **figures: Figure) -> Check:
        """A `Check` of this oracle that the evidence cannot decide: ``detail`` says what
        was missing. It never passes, and it scores as failed."""
        return Check(
            name=self.name,
            passed=False,
            figure=None,
            unit=unit,
            expected=expected,
            detail=detail,
            figures={key: rounded(value) for key, value in figures.items()},
            judged=False,
        )


def registered() -> dict[str, type[ExpectOracle]]:
    """Every check declared so far (each subclass with a name of its own), by name, in
    the order of their expectations."""
    found, todo = [], list(ExpectOracle.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        # A class refused at its declaration (no expectation) may linger until collected.
        if "name" in vars(cls) and isinstance(vars(cls).get("expectation"), Expectation):
            found.append(cls)
    table: dict[str, type[ExpectOracle]] = {}
    for cls in sorted(found, key=lambda c: c.expectation.order):
        clash = table.get(cls.name) or next(
            (c for c in table.values() if c.expectation.order == cls.expectation.order), None
        )
        if clash is not None:
            pair = " and ".join(sorted((clash.__name__, cls.__name__)))
            raise TypeError(f"checks {pair} share a name or an order")
        table[cls.name] = cls
    return table
