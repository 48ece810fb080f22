"""What an oracle judges from, and what it answers: `Evidence` in, one `Check` out.

An oracle is one small class per check (see `harness.oracles`). It reads the journal of
the faulted run (and, where the check needs one, of the fault-free baseline) and the
files the run left on disk; it never trusts a trainer's claim alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from harness.journal import Journal

#: A measured figure: a number, a name, or nothing when it could not be measured.
Figure = float | int | str | None


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict: pass or fail, with the figure it measured and what it wanted."""

    name: str
    passed: bool
    #: The main measured figure (latency in steps, relative loss gap, count, ...).
    figure: Figure
    #: Unit of ``figure``: "steps", "s", "relative", "docs", "" for counts and flags.
    unit: str
    #: The threshold, in words: "<= 0 steps", "true", "<= 0.05".
    expected: str
    #: One sentence a user reads in a failure report.
    detail: str
    #: Further figures by name (for example the detector and the latency in seconds).
    figures: dict[str, Figure] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON scorecard."""
        return {
            "name": self.name,
            "passed": self.passed,
            "figure": self.figure,
            "unit": self.unit,
            "expected": self.expected,
            "detail": self.detail,
            "figures": dict(self.figures),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        """Read back what `to_dict` wrote."""
        return cls(
            name=data["name"],
            passed=bool(data["passed"]),
            figure=data.get("figure"),
            unit=data.get("unit", ""),
            expected=data.get("expected", ""),
            detail=data.get("detail", ""),
            figures=dict(data.get("figures", {})),
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything a check may look at for one scenario."""

    #: Journal of the faulted run, every rank and restart merged.
    journal: Journal
    #: The faulted run's directory (checkpoints and manifests live under it).
    run_dir: Path
    #: The step the run was asked to train to.
    target_steps: int
    #: Exit code of the trainer's launcher; None when it was killed at its deadline.
    exit_code: int | None = 0
    #: Journal of the fault-free run of the same configuration, when one was run.
    baseline: Journal | None = None


@runtime_checkable
class Oracle(Protocol):
    """One check: built from its expectation, judges evidence into a `Check`."""

    #: The check's name, the same as its key under ``expect:`` in a scenario.
    name: ClassVar[str]

    def judge(self, evidence: Evidence) -> Check:
        """The verdict of this check on ``evidence``."""
        ...
