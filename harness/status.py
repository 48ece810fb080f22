"""What a running (or finished) job is doing, from its journal: step, loss, and the
faults armed by live commands and those that fired."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.journal import Journal


@dataclass(frozen=True, slots=True)
class JobStatus:
    """The job as its journal shows it now."""

    running: bool
    step: int
    loss: float | None
    armed: list[dict[str, Any]] = field(default_factory=list)
    fired: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)


def job_status(journal: Journal) -> JobStatus:
    """Step and loss of the furthest rank, commands armed but not yet fired, faults fired."""
    steps = journal.of_kind("step")
    last = steps[-1] if steps else None
    starts, ends = journal.of_kind("run_start"), journal.of_kind("run_end")
    running = bool(starts) and (not ends or ends[-1].wall < starts[-1].wall)
    fired = [
        {"step": e.step, "rank": e.rank, "fault": e["fault"], "target": e.get("target", "")}
        for e in journal.of_kind("fault_injected")
    ]
    fired_at = {(f["fault"], f["step"]) for f in fired}
    armed, rejected, seen = [], [], set()
    for e in journal.of_kind("command"):
        if e["id"] in seen:  # every rank journals an accepted command; list it once
            continue
        seen.add(e["id"])
        if not e["accepted"]:
            rejected.append({"id": e["id"], "reason": e.get("reason", "")})
        elif (e["fault"], e["effective_step"]) not in fired_at:
            armed.append({"id": e["id"], "fault": e["fault"], "step": e["effective_step"]})
    return JobStatus(
        running=running,
        step=max((e.step for e in steps), default=0),
        loss=float(last["loss"]) if last is not None else None,
        armed=armed,
        fired=fired,
        rejected=rejected,
    )
