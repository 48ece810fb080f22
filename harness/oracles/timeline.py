"""Reading a run's story from its journal: rank 0's steps, the faults, the detections.

Every helper tolerates odd evidence (missing fields, wrong types): the oracles must turn
missing evidence into a failing check, never into a traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.journal import Event, Journal

#: The rank whose steps tell the run's progress (every rank reports the same global loss).
LEAD_RANK = 0
#: The detail of a check that needs a fault when the journal shows none.
NO_FAULT = "no fault was injected (no fault_injected event)"
#: Event kinds that say "something is wrong" and the detector each one counts as; a
#: `detected` event names its own detector.
DETECTION_KINDS = {
    "detected": "",
    "checkpoint_rejected": "checkpoint_integrity",
    "rank_lost": "rank_lost",
}


def as_float(value: Any) -> float | None:
    """``value`` as a float (NaN and infinities included), or None when it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def finite(value: Any) -> bool:
    """True when ``value`` is a finite number."""
    number = as_float(value)
    return number is not None and math.isfinite(number)


def lead_steps(journal: Journal) -> list[Event]:
    """Rank 0's `step` events in journal order, redone attempts included."""
    return [e for e in journal if e.kind == "step" and e.rank == LEAD_RANK]


def faults(journal: Journal) -> list[Event]:
    """The `fault_injected` events, in journal order."""
    return journal.of_kind("fault_injected")


def first_fault(journal: Journal) -> Event | None:
    """The first `fault_injected` event; None when nothing was injected."""
    found = faults(journal)
    return found[0] if found else None


def skipped(step: Event) -> bool:
    """True when the step's optimizer update was skipped."""
    return step.get("skipped") is True


def good(step: Event) -> bool:
    """A good step: its loss is finite and its update was applied."""
    return finite(step.get("loss")) and not skipped(step)


def surviving_losses(journal: Journal, rank: int = LEAD_RANK) -> list[float]:
    """Loss of each step's surviving attempt in step order; NaN where none is readable."""
    steps = journal.steps(rank)
    losses = (as_float(steps[s].get("loss")) for s in sorted(steps))
    return [math.nan if loss is None else loss for loss in losses]


def at_or_after(event: Event, fault: Event) -> bool:
    """True when ``event`` happened at or after ``fault``.

    By wall time, except that an event of the fault's own step and attempt counts even a
    little earlier: another rank's clock may run behind the injecting rank's.
    """
    if event.wall >= fault.wall:
        return True
    return event.step == fault.step and event.restart == fault.restart


@dataclass(frozen=True, slots=True)
class Detection:
    """One event that says a problem was seen, and the detector it counts as."""

    event: Event
    detector: str


def detections(journal: Journal) -> list[Detection]:
    """Every detection in the journal: `detected`, `checkpoint_rejected`, `rank_lost`."""
    found = []
    for event in journal:
        if event.kind not in DETECTION_KINDS:
            continue
        detector = DETECTION_KINDS[event.kind] or str(event.get("detector", "unnamed"))
        found.append(Detection(event, detector))
    return found


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, with an s unless there is exactly one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
