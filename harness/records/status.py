"""What a running (or finished) job is doing, from its journal: step, loss, and the
faults armed by live commands and those that fired."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.records.events import CommandAnswered, FaultInjected, RunEnd, RunStart, StepObserved
from harness.records.journal import Journal


@dataclass(frozen=True, slots=True)
class Armed:
    """A live command the job armed that has not fired yet."""

    id: str
    fault: str
    step: int


@dataclass(frozen=True, slots=True)
class Fired:
    """A fault that fired: where and on what."""

    fault: str
    step: int
    rank: int
    target: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A live command the job refused, with why."""

    id: str
    reason: str


@dataclass(frozen=True, slots=True)
class JobStatus:
    """The job as its journal shows it now."""

    running: bool
    step: int
    loss: float | None
    armed: list[Armed] = field(default_factory=list)
    fired: list[Fired] = field(default_factory=list)
    rejected: list[Refused] = field(default_factory=list)


def job_status(journal: Journal) -> JobStatus:
    """Step and loss of the furthest rank, commands armed but not yet fired, faults fired."""
    steps = journal.of_kind(StepObserved)
    last = steps[-1] if steps else None
    starts, ends = journal.of_kind(RunStart), journal.of_kind(RunEnd)
    running = bool(starts) and (not ends or ends[-1].wall < starts[-1].wall)
    fired = [
        Fired(fault=e["fault"], step=e.step, rank=e.rank, target=e.get("target", ""))
        for e in journal.of_kind(FaultInjected)
    ]
    fired_at = {(f.fault, f.step) for f in fired}
    armed: list[Armed] = []
    rejected: list[Refused] = []
    seen: set[str] = set()
    for e in journal.of_kind(CommandAnswered):
        if e["id"] in seen:  # every rank journals an accepted command; list it once
            continue
        seen.add(e["id"])
        if not e["accepted"]:
            rejected.append(Refused(id=e["id"], reason=e.get("reason", "")))
        elif (e["fault"], e["effective_step"]) not in fired_at:
            armed.append(Armed(id=e["id"], fault=e["fault"], step=e["effective_step"]))
    return JobStatus(
        running=running,
        step=max((e.step for e in steps), default=0),
        loss=float(last["loss"]) if last is not None else None,
        armed=armed,
        fired=fired,
        rejected=rejected,
    )
