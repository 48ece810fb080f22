"""Did byte-fallback tokens reach the model?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from harness.oracles.base import ExpectOracle
from harness.oracles.data import _count
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence
from harness.records.events import StepObserved


@dataclass(frozen=True)
class FallbackRateOracle(ExpectOracle):
    """At most this share of the token ids that reached the model were byte fallback."""

    name = "max_fallback_rate"
    expectation = Expectation(
        type=float,
        field=Field(ge=0, le=1, description="Largest share of byte-fallback tokens trained on."),
        order=11,
        symbol="x",
        passes_when="at most a share `x` of the token ids that reached the model were byte "
        "fallback (`fallback_tokens` / `batch_tokens` of every step of every rank and "
        "attempt, counted by the trainer on each batch; docs/stability.md, "
        "tokenizer_fallback)",
        figure="share",
    )
    bound: float = 0.0

    @classmethod
    def from_expect(cls, value: Any) -> FallbackRateOracle:
        """From ``max_fallback_rate: x``."""
        return cls(bound=float(value))

    def judge(self, evidence: Evidence) -> Check:
        """Fallback tokens over batch tokens, summed over every step of every rank and
        attempt (the trainer counts them on the token ids of each batch it trains on)."""
        expected = f"<= {self.bound:g}"
        steps = evidence.journal.of_kind(StepObserved)
        # Every attempt counts: a batch trained on before a rollback still reached the model.
        reported = [
            e for e in steps if "fallback_tokens" in e.fields and "batch_tokens" in e.fields
        ]
        tokens = sum(_count(e.get("batch_tokens")) for e in reported)
        if not tokens:
            what = "no step reports fallback_tokens and batch_tokens" if steps else "no step"
            return self.not_judged(f"never observed: {what}", unit="share", expected=expected)
        fallback = sum(_count(e.get("fallback_tokens")) for e in reported)
        rate = fallback / tokens
        return self.verdict(
            rate <= self.bound,
            rate,
            unit="share",
            expected=expected,
            detail=f"{fallback} byte-fallback tokens of {tokens} trained on",
            tokens=tokens,
        )
