"""A run's steps as the scorecard plots them: one rank's loss, gradient norm and loss scale
in journal order, and the steps where faults, detections and recoveries were journaled."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import JournalError
from harness.records.event_base import Reported
from harness.records.events import Detected, FaultInjected, Recovered, Restart
from harness.records.journal import Journal, read_journal
from harness.records.step_events import StepObserved

#: A plotted value: None where the journal recorded none (a gap, not a fault).
Value = float | None


@dataclass(frozen=True, slots=True)
class StepSeries:
    """One rank's `step` events in journal order, with the steps of the marked events."""

    steps: list[int]
    loss: list[Value]
    grad_norm: list[Value]
    loss_scale: list[Value]
    #: Steps whose optimizer update was skipped (non-finite loss or gradients).
    skipped: list[int] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)
    detections: list[int] = field(default_factory=list)
    recoveries: list[int] = field(default_factory=list)


def _number(value: object) -> Value:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def series_from_journal(journal: Journal) -> StepSeries:
    """Rank 0's steps (or the lowest rank that journaled steps) and the marked events."""
    step_ranks = sorted({e.rank for e in journal if e.is_(StepObserved)})
    rank = 0 if 0 in step_ranks or not step_ranks else step_ranks[0]
    steps = [e for e in journal if e.is_(StepObserved) and e.rank == rank]

    def marked(*kinds: type[Reported]) -> list[int]:
        # Every rank's claims count: a fault is often injected on a rank other than 0.
        return sorted({e.step for e in journal if e.is_(*kinds)})

    return StepSeries(
        steps=[e.step for e in steps],
        loss=[_number(e.get("loss")) for e in steps],
        grad_norm=[_number(e.get("grad_norm")) for e in steps],
        loss_scale=[_number(e.get("loss_scale")) for e in steps],
        skipped=[e.step for e in steps if e.get("skipped") is True],
        faults=marked(FaultInjected),
        detections=marked(Detected),
        recoveries=marked(Recovered, Restart),
    )


def load_series(run_dir: Path) -> tuple[StepSeries | None, list[str]]:
    """A run's series and notes for the reader; None when the journal cannot be read."""
    try:
        journal = read_journal(run_dir, warn=False)
    # ValueError and TypeError: a hand-edited line the reader does not expect; the report
    # notes it and goes on.
    except (JournalError, OSError, ValueError, TypeError) as exc:
        return None, [f"journal unreadable: {exc}"]
    notes = [f"skipped {n} torn line(s)" for n in [len(journal.skipped)] if n]
    series = series_from_journal(journal)
    if not series.steps:
        return None, [*notes, f"the journal in {run_dir} holds no step events"]
    return series, notes
