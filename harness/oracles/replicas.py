"""Did the replicas of a data-parallel job stay identical?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence
from harness.replica_prints import odd_ranks

FIELD = "params_fingerprint"


@dataclass(frozen=True)
class ReplicasConsistentOracle(ExpectOracle):
    """Every rank held the same parameters at each step the agent fingerprinted them, in
    the run's surviving timeline (a diverged step that was rolled back and redone counts by
    its redone attempt)."""

    name = "replicas_consistent"
    expectation = Expectation(
        type=bool,
        order=13,
        passes_when="at every step the agent fingerprinted the parameters (its periodic "
        "checks, with 2+ ranks), every rank held the same ones, in the run's surviving "
        "timeline (a diverged step rolled back and redone counts by its redone attempt); "
        "replicated data parallelism only (sharded parameters differ by design)",
        figure="diverged steps",
    )

    @classmethod
    def from_expect(cls, value: Any) -> ReplicasConsistentOracle:
        """From ``replicas_consistent: true``."""
        return cls()

    def judge(self, evidence: Evidence) -> Check:
        """Steps at which two or more ranks' fingerprints differ."""
        journal, expected = evidence.journal, "0 diverged steps"
        by_step: dict[int, dict[int, str]] = {}
        for rank in journal.ranks:
            for step, event in journal.steps(rank).items():
                value = event.get(FIELD)
                if isinstance(value, str):
                    by_step.setdefault(step, {})[rank] = value
        compared = {s: fps for s, fps in by_step.items() if len(fps) >= 2}
        if not compared:
            what = (
                "only one rank fingerprinted its parameters"
                if by_step
                else f"no step carries {FIELD} (one rank, or no check step)"
            )
            return self.not_judged(f"never observed: {what}", unit="steps", expected=expected)
        diverged = {s: odd_ranks(fps) for s, fps in sorted(compared.items()) if odd_ranks(fps)}
        if diverged:
            first, ranks = next(iter(diverged.items()))
            names = ", ".join(map(str, ranks))
            detail = (
                f"replicas differ at {len(diverged)} of {len(compared)} compared steps, the "
                f"first at step {first} (rank(s) {names} differ)"
            )
        else:
            detail = f"every rank agrees at all {len(compared)} compared steps"
        return self.verdict(
            not diverged,
            len(diverged),
            unit="steps",
            expected=expected,
            detail=detail,
            compared=len(compared),
            first_diverged_step=next(iter(diverged), None),
        )
