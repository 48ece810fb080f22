"""Was the fault seen, how soon, and does the fault-free run cry wolf?

Detection is judged from what the run did (`harness.records.timeline.responses`): the
faulted step skipped, a rollback, a restart, a damaged file refused. A trainer's own
claims (``detected`` events) count only when the response that answers the same fault
backs them (`harness.records.timeline.corroborated`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation, ExpectModel
from harness.oracles.verdict import Check, Evidence
from harness.records.events import StepObserved
from harness.records.timeline import NO_FAULT, corroborated, detections, first_fault, plural


class DetectedExpect(ExpectModel):
    """The fault must be detected: by which detector, how soon after it fired."""

    within_steps: int | None = Field(default=None, ge=0, description="Latest allowed latency.")
    detector: str | list[str] | None = Field(
        default=None, description="Detector(s) that count; any detector when omitted."
    )


@dataclass(frozen=True)
class DetectedOracle(ExpectOracle):
    """The fault is detected, by one of the named detectors, within a number of steps."""

    name = "detected"
    expectation = Expectation(
        type=DetectedExpect | bool,
        order=1,
        needs_fault=True,
        passes_when="a detection of the first injected fault came from the named detector(s) "
        "if given, within `within_steps` steps. A detection is the run's observed answer to "
        "that fault (its first skipped or repaired step, rollback, restart or refused file, "
        "until rank 0 trains a calm step again, and before another fault of the plan), or a "
        "claim (a `detected` event, a `checkpoint_rejected` as `checkpoint_integrity`, a "
        "`rank_lost`) that this answer backs: on the claim's rank or rank 0, at the claim's "
        "step or at most 5 of its rank's steps after it, or that a `rank_blamed` of the same "
        "detector, rank and step backs by naming the rank the fault hit (which the harness "
        "knows from the fault's record and the trainer was never told). A scenario of the "
        "reference trainer "
        "may name only the detectors docs/journal.md lists (a command trainer's, its own "
        "claims too)",
        figure="latency in steps (and seconds)",
    )
    within_steps: int | None = None
    #: Detectors that count; any when empty.
    detectors: tuple[str, ...] = ()

    @classmethod
    def from_expect(cls, value: Any) -> DetectedOracle:
        """From ``detected: true`` or a `DetectedExpect`."""
        if not isinstance(value, DetectedExpect):
            return cls()
        chosen = value.detector
        names = (chosen,) if isinstance(chosen, str) else tuple(chosen or ())
        return cls(within_steps=value.within_steps, detectors=names)

    def _expected(self) -> str:
        words = "detected"
        if self.within_steps is not None:
            words += f" within {plural(self.within_steps, 'step')}"
        if self.detectors:
            words += f" by {' or '.join(self.detectors)}"
        return words

    def judge(self, evidence: Evidence) -> Check:
        """Latency in steps from the first fault to the first qualifying detection."""
        expected = self._expected()
        fault = first_fault(evidence.journal)
        if fault is None:
            return self.not_judged(
                f"{NO_FAULT}, so there was nothing to detect", unit="steps", expected=expected
            )
        after, words = corroborated(evidence.journal, fault)
        counted = [d for d in after if not self.detectors or d.detector in self.detectors]
        if not counted:
            others = sorted({d.detector for d in after})
            by = f" by {' or '.join(self.detectors)}" if self.detectors else ""
            besides = f"; only {', '.join(others)} fired" if others else ""
            claimed = ", ".join(sorted({d.detector for d in words if d.detector not in others}))
            if claimed and others:
                besides += (
                    f"; the trainer claimed {claimed}, but no observed response to the fault "
                    "backs it"
                )
            elif claimed:
                besides += (
                    f"; the trainer claimed {claimed}, but nothing it did shows it (no step "
                    "skipped, rolled back or restarted, no file refused)"
                )
            return self.verdict(
                False,
                None,
                unit="steps",
                expected=expected,
                detail=f"{fault.get('fault', 'the fault')} at step {fault.step} was never "
                f"detected{by}{besides}",
                fault_step=fault.step,
            )
        first = counted[0]
        # After a rollback the detecting step can be numbered below the fault's step.
        latency = max(0, first.event.step - fault.step)
        seconds = max(0.0, first.event.wall - fault.wall)
        passed = self.within_steps is None or latency <= self.within_steps
        verb = "detected by" if passed else "detected too late by"
        return self.verdict(
            passed,
            latency,
            unit="steps",
            expected=expected,
            detail=f"{fault.get('fault', 'the fault')} at step {fault.step} {verb} "
            f"{first.detector} at step {first.event.step}, {plural(latency, 'step')} later",
            detector=first.detector,
            seconds=seconds,
            fault_step=fault.step,
            detection_step=first.event.step,
        )


@dataclass(frozen=True)
class FalseAlarmsOracle(ExpectOracle):
    """The fault-free baseline run raises at most this many detections."""

    name = "max_false_alarms"
    expectation = Expectation(
        type=int,
        field=Field(ge=0),
        order=9,
        symbol="n",
        baseline="always",
        passes_when="the fault-free baseline has at most `n` detections",
        figure="detections",
    )
    bound: int = 0

    @classmethod
    def from_expect(cls, value: Any) -> FalseAlarmsOracle:
        """From ``max_false_alarms: N``."""
        return cls(bound=int(value))

    def judge(self, evidence: Evidence) -> Check:
        """Count of detections in the baseline's journal."""
        expected = f"<= {self.bound}"
        if evidence.baseline is None:
            return self.not_judged(
                "no fault-free baseline run to count false alarms in",
                unit="",
                expected=expected,
            )
        if not evidence.baseline.of_kind(StepObserved):
            # A baseline that never trained raised no alarm because it never ran.
            return self.not_judged(
                "the fault-free baseline run reported no step, so it shows no false alarms "
                "either way",
                unit="",
                expected=expected,
            )
        alarms = detections(evidence.baseline)
        names = sorted({d.detector for d in alarms})
        passed = len(alarms) <= self.bound
        if alarms:
            first = alarms[0]
            detail = (
                f"the fault-free run raised {plural(len(alarms), 'detection')} "
                f"({', '.join(names)}), the first at step {first.event.step}"
            )
        else:
            detail = "the fault-free run raised no detection"
        return self.verdict(
            passed,
            len(alarms),
            unit="",
            expected=expected,
            detail=detail,
            detectors=", ".join(names),
        )
