"""What the fault cost: steps lost to redoing and skipping, and the time to recover."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation, ExpectModel
from harness.oracles.verdict import Check, Evidence
from harness.records.events import FaultInjected, StepObserved
from harness.records.journal import Journal
from harness.records.timeline import (
    LEAD_RANK,
    NO_FAULT,
    lead_steps,
    plural,
    recovery,
    skipped,
)


def step_conflict(journal: Journal) -> str | None:
    """Why step numbers cannot be trusted, when a resumed process's evidence disagreed
    (its first batch trained after the step of the save it loaded); else None."""
    for event in journal.of_kind(StepObserved):
        conflict = event.get("step_conflict")
        if isinstance(conflict, dict):
            return (
                f"rank {event.rank}, attempt {event.restart}: its first batch was trained at "
                f"step {conflict.get('batch_step')} before, but the save it loaded is of step "
                f"{conflict.get('saved_step')}, so its step numbers are unknown"
            )
    return None


@dataclass(frozen=True)
class LostStepsOracle(ExpectOracle):
    """At most this many steps were lost: trained twice, or trained without an update."""

    name = "max_lost_steps"
    expectation = Expectation(
        type=int,
        field=Field(ge=0),
        order=5,
        symbol="n",
        step_field="",
        passes_when="steps redone after a rollback or restart, plus steps skipped, are at most `n`",
        figure="lost steps",
    )
    bound: int = 0

    @classmethod
    def from_expect(cls, value: Any) -> LostStepsOracle:
        """From ``max_lost_steps: N``."""
        return cls(bound=int(value))

    def judge(self, evidence: Evidence) -> Check:
        """Steps redone after rollbacks or restarts, plus surviving steps that were skipped."""
        expected = f"<= {plural(self.bound, 'step')}"
        if (conflict := step_conflict(evidence.journal)) is not None:
            return self.not_judged(conflict, unit="steps", expected=expected)
        steps = lead_steps(evidence.journal)
        if not steps:
            return self.not_judged(
                f"rank {LEAD_RANK} reported no step, so there are no steps to count",
                unit="steps",
                expected=expected,
            )
        redone = len(steps) - len({e.step for e in steps})
        surviving = evidence.journal.steps(LEAD_RANK).values()
        skips = sum(1 for e in surviving if skipped(e))
        lost = redone + skips
        return self.verdict(
            lost <= self.bound,
            lost,
            unit="steps",
            expected=expected,
            detail=f"{plural(redone, 'step')} redone, {plural(skips, 'step')} skipped",
            redone=redone,
            skipped=skips,
        )


class MttrExpect(ExpectModel):
    """Mean time to recovery: from the fault to the first good step after recovery."""

    max_steps: int | None = Field(default=None, ge=0)
    max_seconds: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _some_bound(self) -> MttrExpect:
        if self.max_steps is None and self.max_seconds is None:
            raise ValueError("give max_steps, max_seconds or both")
        return self


@dataclass(frozen=True)
class MttrOracle(ExpectOracle):
    """Time to recovery: from the fault to the first good step once the incident is over."""

    name = "mttr"
    expectation = Expectation(
        type=MttrExpect,
        order=6,
        step_field="max_steps",
        passes_when="from the first fault to the first good step (finite loss, not skipped) "
        "after the last recovery action or skip",
        figure="seconds (and steps)",
    )
    max_steps: int | None = None
    max_seconds: float | None = None

    @classmethod
    def from_expect(cls, value: Any) -> MttrOracle:
        """From an `MttrExpect`."""
        if not isinstance(value, MttrExpect):
            return cls()
        return cls(max_steps=value.max_steps, max_seconds=value.max_seconds)

    def _expected(self) -> str:
        bounds = []
        if self.max_steps is not None:
            bounds.append(f"<= {plural(self.max_steps, 'step')}")
        if self.max_seconds is not None:
            bounds.append(f"<= {self.max_seconds:g} s")
        return " and ".join(bounds) or "recovered"

    def judge(self, evidence: Evidence) -> Check:
        """Seconds (and steps) from the first fault to the first good step after the
        incident's last recovery event or skipped step (`harness.records.timeline.recovery`)."""
        expected = self._expected()
        journal = list(evidence.journal)
        start = next((i for i, e in enumerate(journal) if e.is_(FaultInjected)), None)
        if start is None:
            return self.not_judged(
                f"{NO_FAULT}, so there was nothing to recover from", unit="s", expected=expected
            )
        # Positions in the merged journal order events by wall time across ranks and keep
        # each rank's own order where two events share a timestamp.
        found = recovery(journal, start, past_fault=False)
        fault, point = found.fault, found.back
        if point is None or found.seconds is None or found.steps is None:
            last = found.last_sign
            return self.verdict(
                False,
                None,
                unit="s",
                expected=expected,
                detail=f"never recovered: no good step on rank {LEAD_RANK} after the "
                f"{last.kind} at step {last.step}",
                fault_step=fault.step,
            )
        seconds, steps = found.seconds, found.steps
        over = []
        if self.max_steps is not None and steps > self.max_steps:
            over.append(f"{plural(steps, 'step')} > {self.max_steps}")
        if self.max_seconds is not None and seconds > self.max_seconds:
            over.append(f"{seconds:.3g} s > {self.max_seconds:g} s")
        detail = (
            f"first good step after the fault at step {fault.step} is step {point.step}, "
            f"{seconds:.3g} s and {plural(steps, 'step')} later"
        )
        if over:
            detail += f" (too slow: {', '.join(over)})"
        return self.verdict(
            not over,
            seconds,
            unit="s",
            expected=expected,
            detail=detail,
            steps=steps,
            fault_step=fault.step,
            recovered_at_step=point.step,
        )
