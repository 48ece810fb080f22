"""Which rank was to blame, and what a slow rank cost: ``culprit_named`` judges the
``rank_blamed`` events against the rank each fault hit (from its own ``fault_injected``
record, which the trainer never reads); ``max_slowdown`` compares rank 0's steps per
second with the fault-free baseline's."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pydantic import Field

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence
from harness.records.journal import Journal
from harness.records.timeline import (
    LEAD_RANK,
    NO_FAULT,
    faults,
    first_fault,
    hit_rank,
    lead_steps,
    named_culprits,
)


@dataclass(frozen=True)
class CulpritOracle(ExpectOracle):
    """Every rank named as a culprit (``rank_blamed``) after the first fault is a rank a
    fault hit, and one was named."""

    name = "culprit_named"
    expectation = Expectation(
        type=bool,
        order=18,
        needs_fault=True,
        passes_when="a `rank_blamed` event after the first fault names a rank a fault acted "
        "on (its `fault_injected` record's `details.rank`, else the rank that journaled "
        "it), and none names another rank; fails when none is named",
        figure="ranks named",
    )

    def judge(self, evidence: Evidence) -> Check:
        """The ranks named against the ranks hit."""
        fault = first_fault(evidence.journal)
        if fault is None:
            return self.not_judged(
                f"{NO_FAULT}, so no rank was to blame", unit="ranks", expected="the rank hit"
            )
        hit = sorted({hit_rank(f) for f in faults(evidence.journal)})
        expected = f"rank {' or '.join(map(str, hit))}"
        named = named_culprits(evidence.journal, fault)
        ranks = sorted({int(e.get("blamed_rank", -1)) for e in named})
        wrong = [r for r in ranks if r not in hit]
        if not named:
            detail = f"no rank was named after the fault at step {fault.step} (hit {expected})"
        elif wrong:
            by = sorted({str(e.get("detector")) for e in named if e.get("blamed_rank") in wrong})
            detail = (
                f"rank {', '.join(map(str, wrong))} named by {', '.join(by)}, but the fault "
                f"hit {expected}"
            )
        else:
            first = named[0]
            detail = (
                f"rank {first.get('blamed_rank')} named by {first.get('detector')} at step "
                f"{first.step}: {first.get('reason', '')}".rstrip(": ")
            )
        return self.verdict(
            bool(named) and not wrong,
            len(ranks),
            unit="ranks",
            expected=expected,
            detail=detail,
            named=" ".join(map(str, ranks)) or "none",
            hit=" ".join(map(str, hit)),
        )


def steps_per_second(journal: Journal) -> tuple[float, int] | None:
    """Rank 0's pace: steps it finished per second of wall time between its first and
    last step event (restarts and reloads in between count, as they cost the run), and
    how many steps; None with fewer than two steps."""
    steps = lead_steps(journal)
    if len(steps) < 2:
        return None
    seconds = sum(max(b.wall - a.wall, 0.0) for a, b in pairwise(steps))
    return ((len(steps) - 1) / seconds if seconds > 0 else float("inf")), len(steps)


@dataclass(frozen=True)
class SlowdownOracle(ExpectOracle):
    """Rank 0's steps per second is at least the baseline's divided by ``bound``."""

    name = "max_slowdown"
    expectation = Expectation(
        type=float,
        field=Field(ge=1, description="Largest baseline steps/s over the run's steps/s."),
        order=19,
        symbol="x",
        baseline="always",
        passes_when="the fault-free baseline's steps per second (rank 0, first step to "
        "last) is at most `x` times the faulted run's",
        figure="slowdown, x",
    )
    bound: float = 2.0

    @classmethod
    def from_expect(cls, value: Any) -> SlowdownOracle:
        """From ``max_slowdown: X``."""
        return cls(bound=float(value))

    def judge(self, evidence: Evidence) -> Check:
        """Baseline pace over the run's pace."""
        expected = f"<= {self.bound:g}x"
        if evidence.baseline is None:
            return self.not_judged(
                "no fault-free baseline run to compare the pace with", unit="x", expected=expected
            )
        run, base = steps_per_second(evidence.journal), steps_per_second(evidence.baseline)
        if run is None or base is None:
            which = "faulted run" if run is None else "fault-free baseline run"
            return self.not_judged(
                f"the {which} reported fewer than two steps on rank {LEAD_RANK}",
                unit="x",
                expected=expected,
            )
        slowdown = base[0] / run[0] if run[0] > 0 else float("inf")
        return self.verdict(
            slowdown <= self.bound,
            slowdown,
            unit="x",
            expected=expected,
            detail=f"{run[0]:.3g} steps/s over {run[1]} steps against the baseline's "
            f"{base[0]:.3g} over {base[1]}",
            steps_per_second=run[0],
            baseline_steps_per_second=base[0],
        )
