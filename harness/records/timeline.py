"""Reading a run's story from its journal: rank 0's steps, the faults, the detections,
and the time a run took to recover from a fault.

The one home of the journal queries the oracles, the soak, the sweeps and the
integrations share, with the kinds that say "an incident is going on", "a checkpoint was
reached" and "a piece of work ended". Every helper tolerates odd evidence (missing fields,
wrong types): the oracles must turn missing evidence into a failing check, never into a
traceback.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults.registry import kinds as registered_kinds
from harness.records.detectors import BY_KIND
from harness.records.events import (
    CheckpointLoaded,
    CheckpointRejected,
    CheckpointSaved,
    Detected,
    FaultInjected,
    FileLoaded,
    FileLoadFailed,
    FileSaved,
    RankBlamed,
    RankLost,
    Recovered,
    Restart,
    RunStart,
    StepObserved,
)
from harness.records.journal import Event, Journal

#: The rank whose steps tell the run's progress (every rank reports the same global loss).
LEAD_RANK = 0
#: The detail of a check that needs a fault when the journal shows none.
NO_FAULT = "no fault was injected (no fault_injected event)"
#: Event kinds that say "something is wrong" and the detector each one counts as; a
#: `detected` event names its own detector.
DETECTION_KINDS = {Detected.kind: "", **BY_KIND}
#: Signs that an incident is still being handled (besides rank 0's skipped steps).
INCIDENT_KINDS = frozenset(e.kind for e in (Recovered, Restart, CheckpointLoaded, RankLost))
#: Loads that show a checkpoint was reached.
LOAD_KINDS = frozenset(
    e.kind for e in (FileLoaded, FileLoadFailed, CheckpointLoaded, CheckpointRejected)
)
#: Events after which rank 0 is back to training: a step's time starts at the last one.
BOUNDARY_KINDS = frozenset(
    e.kind
    for e in (StepObserved, RunStart, CheckpointSaved, CheckpointLoaded, FileSaved, FileLoaded)
)


#: Keys of a fault's details that name what it damaged. Not every path there was damaged:
#: a swap's ``source`` was only read.
DAMAGE_KEYS = ("file", "path", "files")


def as_float(value: Any) -> float | None:
    """``value`` as a float (NaN and infinities included), or None when it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def finite(value: Any) -> bool:
    """True when ``value`` is a finite number."""
    number = as_float(value)
    return number is not None and math.isfinite(number)


def lead_step(event: Event) -> bool:
    """True for a `step` event of rank 0."""
    return event.is_(StepObserved) and event.rank == LEAD_RANK


def lead_steps(journal: Journal) -> list[Event]:
    """Rank 0's `step` events in journal order, redone attempts included."""
    return [e for e in journal if lead_step(e)]


def faults(journal: Journal) -> list[Event]:
    """The `fault_injected` events, in journal order."""
    return journal.of_kind(FaultInjected)


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


def incident_sign(event: Event) -> bool:
    """True for an event that shows an incident is still being handled: a recovery, a
    restart, a checkpoint load, a lost rank, or a step rank 0 skipped."""
    return event.kind in INCIDENT_KINDS or (lead_step(event) and skipped(event))


@dataclass(frozen=True, slots=True)
class Recovery:
    """How long a run took to recover from one fault."""

    fault: Event
    #: The incident's last sign (`incident_sign`), or the fault itself when none came.
    last_sign: Event
    #: Rank 0's first good step after that sign (see `recovery`); None: never.
    back: Event | None
    #: Wall seconds from the injection to ``back``.
    seconds: float | None
    #: Rank 0's steps (redone ones included) from the injection to ``back``, ``back`` less one.
    steps: int | None


def recovery(
    events: Sequence[Event], at: int, until: int | None = None, *, past_fault: bool = True
) -> Recovery:
    """The time to recover from the fault ``events[at]``: from its injection to rank 0's
    first good step after the incident's last sign among ``events[at:until]`` (to the end
    of the journal when ``until`` is None), one past the fault's step.

    The soak times its incidents so (each fault's signs before the next fault fires). The
    `mttr` check passes ``past_fault=False`` (the first fault, every sign after it): a
    step redone after a rollback, or the fault's own step when it showed nothing wrong,
    already counts as recovered (docs/scenarios.md and docs/soak.md state each rule)."""
    fault = events[at]
    stop = len(events) if until is None else until
    signs = [m for m in range(at, stop) if incident_sign(events[m])]
    last = signs[-1] if signs else at
    for m in range(last + 1, len(events)):
        e = events[m]
        if lead_step(e) and (e.step > fault.step or not past_fault) and good(e):
            steps = sum(1 for x in events[at : m + 1] if lead_step(x)) - 1
            return Recovery(fault, events[last], e, max(0.0, e.wall - fault.wall), max(0, steps))
    return Recovery(fault, events[last], None, None, None)


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


#: How many of its own rank's steps a claim may come before the response that backs it:
#: a mechanism acts on its detection in the same step or soon after (a loss scale raised
#: on a stalled layer overflows a few steps later); a response further on answers
#: something else.
BACKING_STEPS = 5


def hit_rank(fault: Event) -> int:
    """The rank a `fault_injected` event says the fault acted on: its ``details.rank``,
    else the rank that journaled it (a fault acts where its hooks ran)."""
    details = fault.get("details")
    rank = details.get("rank") if isinstance(details, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else fault.rank


def named_culprits(journal: Journal, fault: Event) -> list[Event]:
    """The `rank_blamed` events at or after ``fault``, in journal order."""
    return [e for e in journal.of_kind(RankBlamed) if at_or_after(e, fault)]


def plan_index(fault: Event) -> int | None:
    """The plan entry a `fault_injected` event belongs to; None when it names none."""
    details = fault.get("details")
    index = details.get("plan_index") if isinstance(details, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def same_fault(a: Event, b: Event) -> bool:
    """True when two `fault_injected` events are one fault of the plan: the same plan entry
    (one that fires on several ranks, or every step), or, where the journal names no plan
    entry, the same kind at the same target."""
    if plan_index(a) is not None or plan_index(b) is not None:
        return plan_index(a) == plan_index(b)
    return bool(a.get("fault") == b.get("fault") and a.get("target") == b.get("target"))


def damages_checkpoints(fault: Event) -> bool:
    """True when a `fault_injected` event is of a checkpoint fault: its damage shows at the
    next load, however many other faults come first."""
    kind = registered_kinds().get(str(fault.get("fault")))
    if kind is not None:
        return kind.spec.fault_class == "checkpoint"
    return bool(damaged_paths(fault, with_target=False))


def _calm(step: Event, trained: set[int]) -> bool:
    """A rank-0 step that trains on as if nothing happened: a new step number, updated
    with finite loss and gradients it did not need repaired."""
    return step.step not in trained and good(step) and step.get("grads_repaired") is not True


def responses(journal: Journal, fault: Event) -> list[Detection]:
    """What the run observably did to answer a fault, whatever it claimed, in journal order.

    The answer starts at the first response at or after the fault and lasts until rank 0
    trains a calm step again; a later skip or rollback answers something else. A response
    past the injection of another fault of the plan answers that one, except a refused
    file, which answers the checkpoint fault whose damage it met (up to the next one).
    Responses:

    - ``skipped_step``: a step at or after the fault ended with no update (any rank);
    - ``gradient_repaired``: a step at or after the fault updated with gradients the agent
      saw non-finite after backward and finite at the optimizer step (any rank);
    - ``rollback``: rank 0 trained a step number again that it had trained before;
    - ``restart``: the launcher restarted the workers;
    - ``checkpoint_integrity``: a load raised and the trainer then loaded another file, or
      it loaded an intact file of its own while a file the fault damaged was there to load.
    """
    damaged = {str(p) for f in faults(journal) for p in damaged_paths(f, with_target=False)}
    found: list[Detection] = []
    trained: set[int] = set()
    failed: list[Event] = []
    # A process that loaded damaged bytes did not avoid them, whatever else it loaded
    # intact beside them (the other files of the same checkpoint).
    took_damage = {
        (e.rank, e.restart)
        for e in journal.of_kind(FileLoaded)
        if e.get("intact") is False or e.get("path") in damaged
    }
    seen = other_fault = other_checkpoint_fault = False
    answer: bool | None = None  # None: not begun; True: going on; False: over
    for event in journal:
        if event is fault:
            seen = True
        elif seen and event.is_(FaultInjected) and not same_fault(event, fault):
            other_fault = True
            other_checkpoint_fault = other_checkpoint_fault or damages_checkpoints(event)
        if other_checkpoint_fault:
            break
        after = at_or_after(event, fault)
        detector = None
        if event.is_(StepObserved) and event.rank == LEAD_RANK:
            if after and event.step in trained:
                detector = "rollback"
            elif after and answer and _calm(event, trained):
                answer = False
            trained.add(event.step)
        if not after:
            continue
        if detector is not None:
            pass
        elif event.is_(StepObserved) and skipped(event):
            detector = "skipped_step"
        elif event.is_(StepObserved) and event.get("grads_repaired") is True:
            detector = "gradient_repaired"
        elif event.is_(Restart):
            detector = "restart"
        elif event.is_(FileLoadFailed):
            failed.append(event)
        elif event.is_(FileLoaded) and (event.rank, event.restart) not in took_damage:
            path = event.get("path")
            if any(f.get("path") != path for f in failed) or (
                event.get("intact") is True and damaged and path not in damaged
            ):
                found.append(Detection(event, "checkpoint_integrity"))
        if detector is not None and not other_fault and answer is not False:
            answer = True
            found.append(Detection(event, detector))
    return found


def _backs(response: Event, claim: Event, between: int) -> bool:
    """Whether an observed response backs a claim: on the claim's rank or rank 0, and
    either of the claim's own step and attempt or at most `BACKING_STEPS` of the claim's
    rank's steps after it (``between``: how many lie between them)."""
    if response.rank not in (claim.rank, LEAD_RANK):
        return False
    if (response.step, response.restart) == (claim.step, claim.restart):
        return True
    return response.wall >= claim.wall and 0 <= between <= BACKING_STEPS


def corroborated(journal: Journal, fault: Event) -> tuple[list[Detection], list[Detection]]:
    """(detections that count, claims that do not): what was observed in answer to the
    fault (`responses`), and the trainer's claims at or after the fault that such a
    response backs (`_backs`); a claim no response to this fault backs is only a word."""
    observed = responses(journal, fault)
    claims = [d for d in detections(journal) if at_or_after(d.event, fault)]
    # A claim that names the very rank the fault hit, which the harness knows and the
    # trainer was never told, is backed by that naming (in its own step and attempt).
    hit = hit_rank(fault)
    right = {
        (e.rank, e.restart, e.step, e.get("detector"))
        for e in named_culprits(journal, fault)
        if e.get("blamed_rank") == hit
    }
    position = {id(e): n for n, e in enumerate(journal)}
    steps_by_rank: dict[int, list[int]] = {}
    for n, e in enumerate(journal):
        if e.is_(StepObserved):
            steps_by_rank.setdefault(e.rank, []).append(n)
    counted: list[Detection] = []
    words: list[Detection] = []
    for claim in claims:
        steps = steps_by_rank.get(claim.event.rank, [])
        at = position[id(claim.event)]

        def between(response: Event, steps: list[int] = steps, at: int = at) -> int:
            return bisect_left(steps, position[id(response)]) - bisect_right(steps, at)

        c = claim.event
        backed = (c.rank, c.restart, c.step, claim.detector) in right or any(
            _backs(r.event, claim.event, between(r.event)) for r in observed
        )
        (counted if backed else words).append(claim)
    return sorted([*observed, *counted], key=lambda d: d.event.wall), words


def damaged_paths(fault: Event, *, with_target: bool = True) -> list[Path]:
    """The files or folders a `fault_injected` event says it damaged (its target too,
    unless ``with_target`` is false: a numeric fault's target is a parameter glob)."""
    named: list[object] = [fault.get("target")] if with_target else []
    details = fault.get("details")
    if isinstance(details, dict):
        for key in DAMAGE_KEYS:
            value = details.get(key)
            named += value if isinstance(value, list) else [value]
    return [Path(p) for p in named if isinstance(p, str) and p]


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, with an s unless there is exactly one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
