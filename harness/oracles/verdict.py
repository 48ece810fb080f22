"""What an oracle judges from, and what it answers: `Evidence` in, one `Check` out.

An oracle is one small class per check (see `harness.oracles`). It reads the journal of
the faulted run (and, where the check needs one, of the fault-free baseline) and the
files the run left on disk; it never trusts a trainer's claim alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from harness.records.journal import Journal

#: A measured figure: a number, a name, or nothing when it could not be measured.
Figure = float | int | str | None
#: A check's outcome. "not judged": no evidence either way, which scores as failed.
CheckStatus = Literal["passed", "failed", "not judged"]


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict: passed, failed or not judged, with the figure it measured and
    what it wanted.

    A check the evidence cannot decide (no fault was injected, no baseline ran, the agent
    never observed what it needs) is not judged: ``judged`` is False, ``passed`` is too,
    and it scores as failed. A missing event is never a pass.
    """

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
    #: False when there was no evidence to judge from; ``detail`` then says what was missing.
    judged: bool = True

    def __post_init__(self) -> None:
        if self.passed and not self.judged:
            raise ValueError(f"check {self.name!r} passed without being judged")

    @property
    def status(self) -> CheckStatus:
        """passed, failed, or not judged (no evidence; it counts as failed)."""
        if not self.judged:
            return "not judged"
        return "passed" if self.passed else "failed"

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
            "judged": self.judged,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        """Read back what `to_dict` wrote (a scorecard older than ``judged`` judged all)."""
        return cls(
            name=data["name"],
            passed=bool(data["passed"]),
            figure=data.get("figure"),
            unit=data.get("unit", ""),
            expected=data.get("expected", ""),
            detail=data.get("detail", ""),
            figures=dict(data.get("figures", {})),
            judged=bool(data.get("judged", True)),
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
    #: Processes of the run still alive after its launcher ended; None: not looked.
    left_behind: int | None = None
    #: Those processes, one line each (pid, command line, what started it).
    left_processes: tuple[str, ...] = ()
    #: Wall clock (epoch seconds) when the run's launch ended; None: not known.
    ended: float | None = None


@runtime_checkable
class Oracle(Protocol):
    """One check: built from its expectation, judges evidence into a `Check`."""

    #: The check's name, the same as its key under ``expect:`` in a scenario.
    name: ClassVar[str]

    def judge(self, evidence: Evidence) -> Check:
        """The verdict of this check on ``evidence``."""
        ...
