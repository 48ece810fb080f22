"""No hang outlived the watchdog: the longest time rank 0 went without finishing a step."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pydantic import Field

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence
from harness.records.timeline import LEAD_RANK, lead_steps


@dataclass(frozen=True)
class StallOracle(ExpectOracle):
    """Rank 0 never went longer than ``bound`` seconds between finished steps, restarts
    and loads included, nor from its last step to the end of the launch (a run killed at
    its deadline while hung fails here)."""

    name = "max_stall_seconds"
    expectation = Expectation(
        type=float,
        field=Field(gt=0, description="Longest wait between rank 0's finished steps."),
        order=16,
        symbol="s",
        passes_when="rank 0 never went longer than `s` seconds between finished steps (any "
        "attempt; restarts and loads included), nor from its last step to the end of the "
        "launch: no hang outlived the watchdog",
        figure="longest wait, seconds",
    )
    bound: float = 60.0

    @classmethod
    def from_expect(cls, value: Any) -> StallOracle:
        """From ``max_stall_seconds: S``."""
        return cls(bound=float(value))

    def judge(self, evidence: Evidence) -> Check:
        """The longest gap between rank 0's consecutive step events, by wall clock."""
        expected = f"<= {self.bound:g} s"
        steps = lead_steps(evidence.journal)
        if not steps:
            return self.not_judged(
                f"rank {LEAD_RANK} reported no step, so no stall can be measured",
                unit="s",
                expected=expected,
            )
        walls = [e.wall for e in steps]
        if evidence.ended is not None:
            walls.append(max(evidence.ended, walls[-1]))
        gaps = [(b - a, n) for n, (a, b) in enumerate(pairwise(walls))]
        if not gaps:
            return self.not_judged(
                f"rank {LEAD_RANK} reported one step and the launch's end is not known, so "
                "no wait can be measured",
                unit="s",
                expected=expected,
            )
        longest, where = max(gaps)
        after, tail = steps[where], where == len(steps) - 1
        place = "before the launch ended" if tail else f"before step {steps[where + 1].step}"
        return self.verdict(
            longest <= self.bound,
            longest,
            unit="s",
            expected=expected,
            detail=f"longest wait {longest:.3g} s, after step {after.step} "
            f"(attempt {after.restart}) {place}",
            after_step=after.step,
        )
