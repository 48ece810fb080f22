"""What a soak's faults cost, read from its journal: ETTR, goodput, time to recover.

Every figure rests on what rank 0's journal shows, its wall clock and the launch's
duration as the harness timed it:

- a step's **time** is the wall time from rank 0's previous event of the same process
  that ends a piece of work (a step, a start, a save, a load) to the step's own event,
  so the time a save or a restart took is never counted as training;
- a step is **kept** when its attempt is the last one of its step number (the final
  weights descend from it) and it updated the weights; steps trained again after a
  rollback or restart, and skipped steps, are **lost**;
- **ETTR** (effective training time ratio) is the kept steps' time over the wall time of
  the whole launch, start-up, restarts and saves included;
- **goodput** is the kept steps' tokens per wall second (steps per second when the
  journal gives no tokens), and its ratio to the fault-free run's rate;
- an **incident** is one fault of the plan (its ``fault_injected`` events on any rank).
  Its outcome is ``detected`` when the run observably responded
  (`harness.records.timeline.corroborated`; for a checkpoint fault, only an integrity
  response, up to the next checkpoint fault), ``latent`` for a checkpoint fault whose
  damage no load reached in that time (no load of the damaged folder, or of any, for the
  ``latest`` pointer), else ``missed``. A detected fault's **time to recover** runs from the
  injection to rank 0's first good step past the fault's step after the last sign of the
  incident before the next fault (a skipped step, a restart, a rollback's load, a
  recovery; `harness.records.timeline.recovery`, the rule the `mttr` check uses too);
  missed and latent faults are not timed.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from faults.registry import kinds as registered_kinds
from harness.records.events import (
    CheckpointLoaded,
    CheckpointRejected,
    FaultInjected,
    FaultSkipped,
    RunStart,
    StepObserved,
)
from harness.records.journal import Event, Journal
from harness.records.timeline import (
    BOUNDARY_KINDS,
    LEAD_RANK,
    LOAD_KINDS,
    corroborated,
    damaged_paths,
    good,
    recovery,
)

#: Most points kept of the ETTR-over-time curve.
_CURVE_POINTS = 300

Outcome = Literal["detected", "missed", "latent"]


@dataclass(frozen=True, slots=True)
class Execution:
    """One attempt of one step on rank 0."""

    step: int
    wall: float
    seconds: float
    kept: bool
    tokens: int | None


@dataclass(frozen=True, slots=True)
class Incident:
    """One fault of the plan and what came of it."""

    index: int
    kind: str
    step: int
    #: Seconds after the launch's first event.
    at: float
    outcome: Outcome
    detectors: tuple[str, ...]
    #: Seconds from the injection to recovery; None when the run never recovered, or for a
    #: missed or latent fault (nothing was done about it, so nothing is timed).
    mttr: float | None
    recovered_at_step: int | None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the scorecard."""
        return {
            "index": self.index,
            "kind": self.kind,
            "step": self.step,
            "at": round(self.at, 3),
            "outcome": self.outcome,
            "detectors": list(self.detectors),
            "mttr": None if self.mttr is None else round(self.mttr, 3),
            "recovered_at_step": self.recovered_at_step,
        }


@dataclass(frozen=True, slots=True)
class Measures:
    """A run's effective training time, goodput and incidents."""

    wall_seconds: float
    kept_seconds: float
    kept_steps: int
    executed_steps: int
    kept_tokens: int | None
    incidents: tuple[Incident, ...] = ()
    #: Faults that found nothing to act on (`fault_skipped`), by kind.
    skipped_faults: dict[str, int] = field(default_factory=dict)
    #: (seconds since the first event, ETTR so far) at rank 0's steps, thinned.
    curve: tuple[tuple[float, float], ...] = field(default=())

    @property
    def ettr(self) -> float:
        """Kept steps' time over wall time (0 for a run of no time)."""
        return self.kept_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def steps_lost(self) -> int:
        """Step attempts whose work the final weights do not hold."""
        return self.executed_steps - self.kept_steps

    @property
    def goodput(self) -> float:
        """Kept tokens (steps when no tokens were journaled) per wall second."""
        kept = self.kept_tokens if self.kept_tokens is not None else self.kept_steps
        return kept / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def goodput_unit(self) -> str:
        """tokens/s, or steps/s when the journal gave no token counts."""
        return "tokens/s" if self.kept_tokens is not None else "steps/s"

    def mttr_by_kind(self) -> dict[str, dict[str, Any]]:
        """Per fault kind: how many, detected, missed, latent, never recovered, and the
        median, 90th percentile and largest time to recover (seconds)."""
        out: dict[str, dict[str, Any]] = {}
        for kind in sorted({i.kind for i in self.incidents}):
            mine = [i for i in self.incidents if i.kind == kind]
            times = sorted(i.mttr for i in mine if i.mttr is not None)
            row: dict[str, Any] = {"faults": len(mine)}
            for outcome in ("detected", "missed", "latent"):
                row[outcome] = sum(i.outcome == outcome for i in mine)
            row["unrecovered"] = sum(i.outcome == "detected" and i.mttr is None for i in mine)
            row["median"] = round(statistics.median(times), 3) if times else None
            row["p90"] = round(_quantile(times, 0.9), 3) if times else None
            row["max"] = round(times[-1], 3) if times else None
            out[kind] = row
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the scorecard (`metrics` of the soak's result)."""
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "kept_seconds": round(self.kept_seconds, 3),
            "ettr": round(self.ettr, 4),
            "kept_steps": self.kept_steps,
            "executed_steps": self.executed_steps,
            "steps_lost": self.steps_lost,
            "kept_tokens": self.kept_tokens,
            "goodput": round(self.goodput, 3),
            "goodput_unit": self.goodput_unit,
            "faults": len(self.incidents),
            "detected": sum(i.outcome == "detected" for i in self.incidents),
            "missed": sum(i.outcome == "missed" for i in self.incidents),
            "latent": sum(i.outcome == "latent" for i in self.incidents),
            "skipped_faults": dict(sorted(self.skipped_faults.items())),
            "by_kind": self.mttr_by_kind(),
            "incidents": [i.to_dict() for i in self.incidents],
            "ettr_curve": [[round(t, 2), round(e, 4)] for t, e in self.curve],
        }


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank)."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def executions(journal: Journal) -> list[Execution]:
    """Rank 0's step attempts in journal order, each with its time and whether it is kept."""
    lead = [e for e in journal if e.rank == LEAD_RANK]
    last = {e.step: n for n, e in enumerate(lead) if e.is_(StepObserved)}
    found: list[Execution] = []
    since: Event | None = None
    for n, event in enumerate(lead):
        if event.is_(RunStart):
            since = event
            continue
        if event.is_(StepObserved):
            same = since is not None and since.restart == event.restart
            seconds = max(0.0, event.wall - since.wall) if same and since is not None else 0.0
            tokens = event.get("tokens")
            counted = isinstance(tokens, int) and not isinstance(tokens, bool)
            found.append(
                Execution(
                    step=event.step,
                    wall=event.wall,
                    seconds=seconds,
                    kept=last[event.step] == n and good(event),
                    tokens=tokens if counted else None,
                )
            )
        if event.kind in BOUNDARY_KINDS:
            since = event
    return found


def measure(journal: Journal, wall_seconds: float) -> Measures:
    """The measures of a run whose launch took ``wall_seconds`` (harness-timed)."""
    runs = executions(journal)
    kept = [r for r in runs if r.kept]
    tokens = [r.tokens for r in kept if r.tokens is not None]
    start = min((e.wall for e in journal), default=0.0)
    found = tuple(incidents(journal, start))
    return Measures(
        wall_seconds=wall_seconds,
        kept_seconds=sum(r.seconds for r in kept),
        kept_steps=len(kept),
        executed_steps=len(runs),
        # Tokens only when every kept step counted them: a partial sum would be no rate.
        kept_tokens=sum(tokens) if kept and len(tokens) == len(kept) else None,
        incidents=found,
        skipped_faults=_skipped(journal, {i.index for i in found}),
        curve=_curve(runs, start),
    )


def _skipped(journal: Journal, injected: set[int]) -> dict[str, int]:
    """Faults of the plan that found nothing to act on, by kind, once per plan fault and
    only when it acted nowhere else (not on another rank, nor at another of its steps)."""
    seen: dict[object, str] = {}
    for e in journal.of_kind(FaultSkipped):
        details = e.get("details")
        index = details.get("plan_index") if isinstance(details, dict) else None
        if index in injected:
            continue
        seen.setdefault(index if index is not None else id(e), str(e.get("fault")))
    return dict(Counter(seen.values()))


def _curve(runs: list[Execution], start: float) -> tuple[tuple[float, float], ...]:
    """ETTR so far at each step attempt: kept time until then over time since the start."""
    points: list[tuple[float, float]] = []
    kept = 0.0
    for r in runs:
        kept += r.seconds if r.kept else 0.0
        elapsed = r.wall - start
        if elapsed > 0:
            points.append((elapsed, min(1.0, kept / elapsed)))
    stride = max(1, len(points) // _CURVE_POINTS)
    thinned = points[::stride]
    if points and thinned[-1] != points[-1]:
        thinned.append(points[-1])
    return tuple(thinned)


def _fault_class(kind: str) -> str:
    table = registered_kinds()
    return table[kind].spec.fault_class if kind in table else ""


def incidents(journal: Journal, start: float) -> list[Incident]:
    """One incident per fault of the plan that fired, in the order they fired."""
    events = list(journal)
    firsts: dict[object, int] = {}
    for n, e in enumerate(events):
        if not e.is_(FaultInjected):
            continue
        details = e.get("details")
        index = details.get("plan_index") if isinstance(details, dict) else None
        firsts.setdefault(index if index is not None else ("event", n), n)
    order = sorted(firsts.items(), key=lambda item: item[1])
    found = []
    for k, (key, n) in enumerate(order):
        fault = events[n]
        kind = str(fault.get("fault", "unknown"))
        checkpoint = _fault_class(kind) == "checkpoint"
        later = [m for _, m in order[k + 1 :]]
        if checkpoint:  # its damage shows at the next load, which a later fault may cause
            later = [m for m in later if _fault_class(str(events[m].get("fault"))) == "checkpoint"]
        end = later[0] if later else len(events)
        window = events[:end]
        counted, _claims = corroborated(Journal(window), fault)
        if checkpoint:
            counted = [d for d in counted if d.detector == "checkpoint_integrity"]
        outcome: Outcome = "detected" if counted else "missed"
        if not counted and checkpoint and not _reached(fault, events[n:end]):
            outcome = "latent"
        # Recovery is timed for detected faults only: a missed or latent one had nothing
        # done about it; its signs end where the next fault of any kind begins.
        mttr, back = None, None
        if outcome == "detected":
            following = order[k + 1][1] if k + 1 < len(order) else len(events)
            timed = recovery(events, n, following)
            mttr, back = timed.seconds, timed.back.step if timed.back is not None else None
        found.append(
            Incident(
                index=int(key) if isinstance(key, int) else -1,
                kind=kind,
                step=fault.step,
                at=fault.wall - start,
                outcome=outcome,
                detectors=tuple(sorted({d.detector for d in counted})),
                mttr=mttr,
                recovered_at_step=back,
            )
        )
    return found


def _reached(fault: Event, after: list[Event]) -> bool:
    """Whether a load after a checkpoint fault went to what it damaged: the folder of a
    damaged file, or any checkpoint when it damaged the ``latest`` pointer beside them."""
    damaged = damaged_paths(fault, with_target=False) or damaged_paths(fault)
    for e in after:
        path = e.get("path")
        if e.kind not in LOAD_KINDS or not isinstance(path, str):
            continue
        loaded = Path(path)
        folder = loaded if e.is_(CheckpointLoaded, CheckpointRejected) else loaded.parent
        if any(d == folder or folder in d.parents or d.parent == folder.parent for d in damaged):
            return True
    return False
