"""Did contaminated data reach the model?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.oracles.base import ExpectOracle
from harness.oracles.verdict import Check, Evidence


def _count(value: Any) -> int:
    """A document count from the journal; 0 when absent or not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class ContaminationOracle(ExpectOracle):
    """At most this many injected duplicate documents entered training, on all ranks."""

    name = "max_contamination_consumed"
    bound: int = 0

    @classmethod
    def from_expect(cls, value: Any) -> ContaminationOracle:
        """From ``max_contamination_consumed: N``."""
        return cls(bound=int(value))

    def judge(self, evidence: Evidence) -> Check:
        """Contaminated documents summed over every step of every rank and attempt."""
        expected = f"<= {self.bound} docs"
        # Every attempt counts: a document trained on before a rollback was still consumed.
        steps = evidence.journal.of_kind("step")
        reported = [e for e in steps if "contaminated_docs" in e.fields]
        if not reported:
            what = "no step reports contaminated_docs" if steps else "no step was reported"
            return self.not_judged(f"never observed: {what}", unit="docs", expected=expected)
        consumed = sum(_count(e.get("contaminated_docs")) for e in reported)
        docs = sum(_count(e.get("docs")) for e in steps)
        return self.verdict(
            consumed <= self.bound,
            consumed,
            unit="docs",
            expected=expected,
            detail=f"{consumed} contaminated of {docs} documents trained on",
            docs=docs,
        )


@dataclass(frozen=True)
class ToxicOracle(ExpectOracle):
    """At most this many injected toxic documents entered training, on all ranks."""

    name = "max_toxic_consumed"
    bound: int = 0

    @classmethod
    def from_expect(cls, value: Any) -> ToxicOracle:
        """From ``max_toxic_consumed: N``."""
        return cls(bound=int(value))

    def judge(self, evidence: Evidence) -> Check:
        """``contaminated_kinds["toxic"]`` summed over every step of every rank and attempt."""
        expected = f"<= {self.bound} docs"
        steps = evidence.journal.of_kind("step")
        reported = [e for e in steps if isinstance(e.get("contaminated_kinds"), dict)]
        if not reported:
            what = "no step reports contaminated_kinds" if steps else "no step was reported"
            return self.not_judged(f"never observed: {what}", unit="docs", expected=expected)
        consumed = sum(_count(e.get("contaminated_kinds").get("toxic")) for e in reported)
        docs = sum(_count(e.get("docs")) for e in steps)
        return self.verdict(
            consumed <= self.bound,
            consumed,
            unit="docs",
            expected=expected,
            detail=f"{consumed} toxic of {docs} documents trained on",
            docs=docs,
        )
