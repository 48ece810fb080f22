"""Shrinking: the smallest part of a fault plan that still breaks an invariant.

Delta debugging (Zeller's ddmin) over the plan's faults: try each of n chunks alone,
then each complement, keep the first that still breaks, otherwise split finer. Every
trial is a real run of the trainer, so the search stops at a trial budget or a deadline
and returns the smallest failing plan found so far: it is always one that was seen to
fail, never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Shrunk(Generic[T]):
    """What shrinking found."""

    #: The smallest failing plan seen (the whole plan when no trial failed).
    items: tuple[T, ...]
    #: Trials run, and how many of them failed.
    trials: int
    failed: int
    #: True when the search ended at 1-minimality; False when the budget ran out first.
    complete: bool


def _chunks(items: Sequence[T], n: int) -> list[tuple[T, ...]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(items[start:end]))
        start = end
    return [c for c in out if c]


def shrink(
    items: Sequence[T],
    fails: Callable[[tuple[T, ...]], bool],
    *,
    max_trials: int = 30,
    deadline: float | None = None,
) -> Shrunk[T]:
    """The smallest sub-plan of ``items`` for which ``fails`` holds, by ddmin.

    ``items`` must fail already (it is not run again). ``deadline`` is a
    ``time.monotonic()`` instant after which no trial starts."""
    current, n, trials, failed = tuple(items), 2, 0, 0

    def budget_left() -> bool:
        return trials < max_trials and (deadline is None or time.monotonic() < deadline)

    while len(current) >= 2:
        chunks = _chunks(current, n)
        complements = [
            tuple(x for j, c in enumerate(chunks) if j != i for x in c) for i in range(len(chunks))
        ]
        # Chunks alone first (a single culprit is found fastest), then complements (more
        # than two chunks only: with two, a complement is the other chunk).
        candidates = [(c, 2) for c in chunks] + (
            [(c, max(n - 1, 2)) for c in complements] if len(chunks) > 2 else []
        )
        for candidate, next_n in candidates:
            if not budget_left():
                return Shrunk(current, trials, failed, complete=False)
            trials += 1
            if fails(candidate):
                failed += 1
                current, n = candidate, next_n
                break
        else:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return Shrunk(current, trials, failed, complete=True)
