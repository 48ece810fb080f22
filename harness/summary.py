"""A short account of one run, computed from its journal alone."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.journal import Journal


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a run did, as its journal tells it."""

    ranks: int
    restarts: int
    steps: int
    target_steps: int | None
    status: str
    loss_by_step: tuple[tuple[int, float], ...]
    tokens: int
    median_step_time: float | None
    checkpoints_saved: int
    checkpoints_loaded: int

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens per second of training steps (excluding start-up and checkpoints)."""
        if not self.median_step_time or not self.steps:
            return None
        return self.tokens / self.steps / self.median_step_time

    def loss_milestones(self, count: int = 7) -> list[tuple[int, float]]:
        """About ``count`` (step, loss) pairs spread evenly over the run, first and last
        included."""
        points = self.loss_by_step
        if len(points) <= count:
            return list(points)
        picks = {round(i * (len(points) - 1) / (count - 1)) for i in range(count)}
        return [points[i] for i in sorted(picks)]


def summarize(journal: Journal) -> RunSummary:
    """Summarize a run from its merged journal (rank 0's view of the loss)."""
    rank = journal.ranks[0] if journal.ranks else 0
    steps = journal.steps(rank)
    starts = journal.of_kind("run_start")
    ends = [e for e in journal.of_kind("run_end") if e.rank == rank]
    times = [float(e["step_time"]) for e in steps.values() if "step_time" in e.fields]
    target = starts[-1].get("target_steps") if starts else None
    return RunSummary(
        ranks=len(journal.ranks),
        restarts=max((e.restart for e in journal), default=0),
        steps=max(steps, default=0),
        target_steps=int(target) if target is not None else None,
        status=str(ends[-1]["status"]) if ends else "running or killed",
        loss_by_step=tuple((s, float(steps[s]["loss"])) for s in sorted(steps)),
        tokens=sum(int(e.get("tokens", 0)) for e in steps.values()),
        median_step_time=statistics.median(times) if times else None,
        checkpoints_saved=len(journal.of_kind("checkpoint_saved")),
        checkpoints_loaded=len([e for e in journal.of_kind("checkpoint_loaded") if e.rank == rank]),
    )
