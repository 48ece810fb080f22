"""Which of a plan's faults are due on this rank at a step, and which already happened.

The agent (`harness.inside.agent`) keeps one: each fault's injector, in plan order (faults
armed live are added at the end), the steps at which rank 0's clock fired the
``after_seconds`` ones, and the (plan index, step) pairs already injected, learnt from the
journal of an earlier attempt too, so that a restarted job does not meet them again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from faults import FaultPlan, FaultSpec, FaultSpecError, Injector, build_injector
from harness.inside.process_group import broadcast_text
from harness.records.events import FaultInjected, FaultSkipped


class FaultSchedule:
    """A plan's faults with their injectors, and when each is due on one rank."""

    def __init__(self, plan: FaultPlan, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.injectors: list[tuple[FaultSpec, Injector[Any]]] = []
        self.index: dict[int, int] = {}  # id(injector) -> plan index
        for spec in plan:
            self.add(spec)
        self.timed = [
            i for i, (spec, _) in enumerate(self.injectors) if spec.after_seconds is not None
        ]
        self.timed_start: dict[int, int] = {}  # plan index -> step an after_seconds fault fired
        self.fired: set[tuple[int, int]] = set()  # (plan index, step) already injected

    def add(self, spec: FaultSpec) -> None:
        """One more fault (armed live), after the others."""
        self.injectors.append((spec, build_injector(spec)))
        self.index[id(self.injectors[-1][1])] = len(self.injectors) - 1

    def due(self, step: int) -> list[Injector[Any]]:
        """The injectors active at ``step`` on this rank. A step replayed after a rollback
        or restart does not meet its fault again: a fault happens at a step once
        (persistent faults span steps with ``duration``)."""
        return [
            inj
            for i, (spec, inj) in enumerate(self.injectors)
            if (i, step) not in self.fired and self._is_active(i, spec, step)
        ]

    def _is_active(self, index: int, spec: FaultSpec, step: int) -> bool:
        if self.rank not in spec.target_ranks(self.world_size):
            return False
        if spec.after_seconds is None:
            return spec.active_at(step)
        start = self.timed_start.get(index)  # decided by rank 0 in `agree_timers`
        return start is not None and start <= step < start + spec.duration

    def agree_timers(self, step: int, elapsed: float) -> None:
        """Rank 0's clock (``elapsed`` seconds since the agent started) decides which
        ``after_seconds`` faults fire now; every rank arms them for the same step (one small
        broadcast per step, only while timers wait)."""
        if all(i in self.timed_start for i in self.timed):
            return
        timers = [
            i
            for i in self.timed
            if i not in self.timed_start and elapsed >= self.injectors[i][0].after_seconds  # type: ignore[operator]
        ]
        shared = json.loads(broadcast_text(json.dumps(timers), self.rank, self.world_size))
        for index in shared:
            self.timed_start[int(index)] = step

    def remember(self, events: Iterable[Any]) -> None:
        """Learn from earlier ``fault_injected`` events (of a previous attempt of this run)
        which faults already happened."""
        for event in events:
            details = event.get("details", {})
            index = details.get("plan_index")
            fault = event.is_(FaultInjected, FaultSkipped)
            if fault and event.rank == self.rank and index is not None:
                self.fired.add((int(index), event.step))
                if (trigger := details.get("trigger_step")) is not None:
                    self.fired.add((int(index), int(trigger)))

    def document_wrapper(self) -> Callable[[Iterator[Any]], Any] | None:
        """The `wrap_documents` of the plan's fault that acts on the document stream (reach
        ``documents``), if any; a plan may hold one."""
        found = [(spec, inj) for spec, inj in self.injectors if spec.reach == "documents"]
        if not found:
            return None
        if len(found) > 1:
            names = " and ".join(sorted({spec.kind for spec, _ in found}))
            raise FaultSpecError(f"a plan may hold one {names} fault, not several")
        return found[0][1].wrap_documents
