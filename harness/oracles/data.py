"""Did contaminated data reach the model?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pydantic import Field

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence
from harness.records.events import StepObserved


def _count(value: Any) -> int:
    """A document count from the journal; 0 when absent or not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


ConsumedT = TypeVar("ConsumedT", bound="ContaminationOracle")


@dataclass(frozen=True)
class ContaminationOracle(ExpectOracle):
    """At most this many injected documents entered training, on all ranks: of every
    contamination kind, or of ``kind`` alone."""

    name = "max_contamination_consumed"
    expectation = Expectation(
        type=int,
        field=Field(ge=0),
        order=8,
        symbol="n",
        passes_when="at most `n` injected documents (duplicates, paraphrases, any "
        "contamination kind) reached the model (all ranks, all attempts)",
        figure="documents",
    )
    bound: int = 0
    #: One contamination kind (`contaminated_kinds` of the step events); None: all of them.
    kind: ClassVar[str | None] = None

    @classmethod
    def from_expect(cls: type[ConsumedT], value: Any) -> ConsumedT:
        """From ``max_contamination_consumed: N`` (or the kind's own key)."""
        return cls(bound=int(value))

    def _consumed(self, step: Any) -> int | None:
        """What one step event reports, None when it reports nothing."""
        if self.kind is None:
            return (
                _count(step.get("contaminated_docs"))
                if "contaminated_docs" in step.fields
                else None
            )
        kinds = step.get("contaminated_kinds")
        return _count(kinds.get(self.kind)) if isinstance(kinds, dict) else None

    def judge(self, evidence: Evidence) -> Check:
        """Injected documents summed over every step of every rank and attempt."""
        expected = f"<= {self.bound} docs"
        field = "contaminated_docs" if self.kind is None else "contaminated_kinds"
        # Every attempt counts: a document trained on before a rollback was still consumed.
        steps = evidence.journal.of_kind(StepObserved)
        reported = [n for n in map(self._consumed, steps) if n is not None]
        if not reported:
            what = f"no step reports {field}" if steps else "no step was reported"
            return self.not_judged(f"never observed: {what}", unit="docs", expected=expected)
        consumed = sum(reported)
        docs = sum(_count(e.get("docs")) for e in steps)
        what = "contaminated" if self.kind is None else self.kind
        return self.verdict(
            consumed <= self.bound,
            consumed,
            unit="docs",
            expected=expected,
            detail=f"{consumed} {what} of {docs} documents trained on",
            docs=docs,
        )


@dataclass(frozen=True)
class ToxicOracle(ContaminationOracle):
    """At most this many injected toxic documents entered training, on all ranks."""

    name = "max_toxic_consumed"
    expectation = Expectation(
        type=int,
        field=Field(ge=0),
        order=12,
        symbol="n",
        passes_when='at most `n` injected toxic documents (`contaminated_kinds["toxic"]` of '
        "the step events) reached the model (all ranks, all attempts); not judged when no "
        "step reports `contaminated_kinds`",
        figure="documents",
    )
    kind: ClassVar[str | None] = "toxic"
