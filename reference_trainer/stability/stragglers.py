"""Straggler scores: which rank the others wait for, from each rank's compute time.

Each step every rank measures its compute time: the step's time up to the agreement,
less the time it spent inside all-reduces (a rank that waits for a slow peer waits
there; the slow one does not). A rank's score is, as NVIDIA's resiliency extension's
relative performance score, the fastest rank's time over its own (1: as fast as the
fastest; 0.5: twice as slow), here of each rank's median over the last ``window`` steps
(by default 1: the step's own time). A rank whose score stays
below ``threshold`` for ``patience`` steps in a row is flagged once, until its score
comes back above the threshold. ``min_gap_ms`` ignores gaps too small to matter (a
tiny model's steps of a few milliseconds); the ``after_save`` steps after a checkpoint
save are not scored (rank 0's background write competes with its compute: a slowdown
the job chose, not a fault).

Pure arithmetic on the times handed in: `reference_trainer.stability.straggler_step`
measures and shares them; the benchmark (`benchmarks/stragglers.py`) scores measured runs
with the same class.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class StragglerConfig:
    """How stragglers are scored and flagged."""

    enabled: bool = True
    """Score every rank at every step (jobs of two ranks or more)."""
    threshold: float = 0.7
    """A score below this is slow (NVIDIA's resiliency extension's default, 0.7)."""
    window: int = 1
    """Steps whose median compute time a rank's score is taken from (1: each step's own;
    benchmarks/stragglers.py found a median of 3 steps no steadier than patience)."""
    patience: int = 5
    """Steps in a row below the threshold before a rank is flagged."""
    min_gap_ms: float = 2.0
    """A rank within this many milliseconds of the fastest is never slow."""
    after_save: int = 3
    """Steps after a checkpoint save that are not scored: rank 0 persists it in a
    background thread that competes with its compute (0: score every step)."""
    rebalance: bool = False
    """Give a flagged rank a smaller share of each micro-step's sequences, the others the
    rest (the global batch kept), until its score recovers
    (`reference_trainer.stability.straggler_shares`; ``--enable straggler_rebalance``)."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(
                f"stability.stragglers.threshold must be in (0, 1), got {self.threshold}"
            )
        for name in ("window", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"stability.stragglers.{name} must be an int >= 1, got {value!r}")
        if (
            isinstance(self.after_save, bool)
            or not isinstance(self.after_save, int)
            or self.after_save < 0
        ):
            raise ValueError(
                f"stability.stragglers.after_save must be an int >= 0, got {self.after_save!r}"
            )
        if self.min_gap_ms < 0:
            raise ValueError(f"stability.stragglers.min_gap_ms must be >= 0, got {self.min_gap_ms}")


@dataclass(frozen=True, slots=True)
class Flag:
    """A rank flagged as a straggler."""

    rank: int
    score: float
    #: The first step of the run of steps below the threshold.
    since: int
    #: Each rank's median compute time, seconds.
    medians: tuple[float, ...]

    def reason(self, cfg: StragglerConfig) -> str:
        """Why, in words."""
        return (
            f"relative score {self.score:.2f} below {cfg.threshold:g} for {cfg.patience} "
            f"steps from step {self.since} (median compute {self.medians[self.rank] * 1000:.1f}"
            f" ms, fastest {min(self.medians) * 1000:.1f} ms)"
        )


@dataclass(slots=True)
class StragglerScores:
    """Every rank's score, step by step."""

    cfg: StragglerConfig
    world_size: int
    _times: list[deque[float]] = field(init=False)
    _below: list[int] = field(init=False)
    _flagged: list[bool] = field(init=False)
    scores: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self._times = [deque(maxlen=self.cfg.window) for _ in range(self.world_size)]
        self._below = [0] * self.world_size
        self._flagged = [False] * self.world_size
        self.scores = [1.0] * self.world_size

    def flagged(self) -> set[int]:
        """The ranks flagged and not recovered since."""
        return {rank for rank, flagged in enumerate(self._flagged) if flagged}

    def observe(self, step: int, times: Sequence[float]) -> list[Flag]:
        """Take each rank's compute time (seconds) of ``step``; the ranks flagged now."""
        if len(times) != self.world_size:
            raise ValueError(f"expected {self.world_size} compute times, got {len(times)}")
        for rank, t in enumerate(times):
            self._times[rank].append(max(float(t), 0.0))
        medians = tuple(statistics.median(d) for d in self._times)
        fastest = min(medians)
        flags = []
        for rank, median in enumerate(medians):
            slow_enough = (median - fastest) * 1000.0 > self.cfg.min_gap_ms
            score = fastest / median if median > 0 else 1.0
            self.scores[rank] = score
            if score < self.cfg.threshold and slow_enough:
                self._below[rank] += 1
            else:
                self._below[rank] = 0
                self._flagged[rank] = False
            if self._below[rank] >= self.cfg.patience and not self._flagged[rank]:
                self._flagged[rank] = True
                since = step - self._below[rank] + 1
                flags.append(Flag(rank, score, since, medians))
        return flags
