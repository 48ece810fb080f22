"""Which checklist items a suite exercises: through the fault kinds its scenarios inject.

An item is exercised by a scenario that injects one of the item's fault kinds; the items
no scenario exercises are what the suite's monitoring misses (an item that no fault
exercises, ``faults: []``, is missed by every suite, and the checklist says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.checklist.catalogue import Item, catalogue


@dataclass(frozen=True, slots=True)
class ItemCoverage:
    """One item against a suite: the scenarios that exercise it, and through which kinds."""

    item: Item
    scenarios: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()

    @property
    def exercised(self) -> bool:
        """Some scenario injects a fault kind that exercises the item."""
        return bool(self.scenarios)


@dataclass(frozen=True, slots=True)
class SuiteChecklist:
    """A suite's checklist: every item, exercised or missed."""

    suite: str
    results: tuple[ItemCoverage, ...]
    fault_kinds: tuple[str, ...]  # the kinds the suite injects, in first-seen order

    @property
    def exercised(self) -> list[ItemCoverage]:
        """Items some scenario exercises, in catalogue order."""
        return [r for r in self.results if r.exercised]

    @property
    def missed(self) -> list[ItemCoverage]:
        """Items no scenario exercises, in catalogue order."""
        return [r for r in self.results if not r.exercised]


def check_scenarios(
    suite: str,
    scenarios: Iterable[tuple[str, Sequence[str]]],
    items: Sequence[Item] | None = None,
) -> SuiteChecklist:
    """The checklist of scenarios given as (name, the fault kinds it injects)."""
    listed = [(name, list(dict.fromkeys(kinds))) for name, kinds in scenarios]
    every = list(dict.fromkeys(k for _, kinds in listed for k in kinds))
    results = []
    for item in catalogue() if items is None else items:
        wanted = set(item.faults)
        names = tuple(name for name, kinds in listed if wanted.intersection(kinds))
        hit = tuple(k for k in every if k in wanted)
        results.append(ItemCoverage(item, names, hit))
    return SuiteChecklist(suite=suite, results=tuple(results), fault_kinds=tuple(every))
