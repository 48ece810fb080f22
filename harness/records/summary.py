"""A short account of one run, computed from its journal alone.

The run's progress is rank 0's (every rank reports the same global loss). Restarts are
told by the events' ``restart`` counter: the last attempt is the one with the highest
counter, and within it the events of rank 0 since its last ``run_start`` (a resume in the
same launch starts a new process with the same counter). Whether the weights ended finite
rests on the agent's ``params_finite`` observations, and on a non-finite loss whose update
was applied at the end of the run, never on the trainer's word.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from harness.records.events import CheckpointLoaded, CheckpointSaved, RunEnd, RunStart, StepObserved
from harness.records.journal import Event, Journal
from harness.records.timeline import LEAD_RANK, as_float, finite, skipped


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a run did, as its journal tells it."""

    ranks: int
    restarts: int
    #: Highest step rank 0 reached in any attempt.
    steps: int
    #: Step at which rank 0's last attempt stopped.
    end_step: int
    target_steps: int | None
    #: The last attempt's ``run_end`` status on rank 0; None when it wrote none.
    status: str | None
    reason: str | None
    #: Step events of rank 0 that repeat a step number an earlier attempt reached.
    steps_redone: int
    #: The step from which the weights stayed non-finite to the end; None when they did not.
    nonfinite_since: int | None
    #: Whether any step carried a ``params_finite`` observation.
    params_observed: bool
    loss_by_step: tuple[tuple[int, float], ...]
    tokens: int
    median_step_time: float | None
    checkpoints_saved: int
    checkpoints_loaded: int

    @property
    def attempts(self) -> int:
        """Times the workers were started by the launcher: the first try and each restart."""
        return self.restarts + 1

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens per second of training steps (excluding start-up and checkpoints)."""
        time = self.median_step_time
        if time is None or not math.isfinite(time) or time <= 0 or not self.loss_by_step:
            return None
        return self.tokens / len(self.loss_by_step) / time

    def loss_ratio(self) -> float | None:
        """Last step's loss over the first step's; None when either is not a usable number."""
        if not self.loss_by_step:
            return None
        first, last = self.loss_by_step[0][1], self.loss_by_step[-1][1]
        if not math.isfinite(first) or first == 0 or not math.isfinite(last):
            return None
        return last / first

    def loss_change(self) -> str:
        """One sentence comparing the last step's loss with the first step's."""
        ratio = self.loss_ratio()
        if ratio is not None:
            return f"{ratio:.2f} of the first step's loss at the last step"
        if not self.loss_by_step:
            return "no loss recorded"
        (first_step, first), (last_step, last) = self.loss_by_step[0], self.loss_by_step[-1]
        if not math.isfinite(first) or first == 0:
            return f"no ratio: the first step's loss (step {first_step}) is {first:g}"
        return f"no ratio: the last step's loss (step {last_step}) is {last:g}"

    def loss_milestones(self, count: int = 7) -> list[tuple[int, float]]:
        """About ``count`` (step, loss) pairs spread evenly over the run, first and last
        included."""
        points = self.loss_by_step
        if len(points) <= count:
            return list(points)
        picks = {round(i * (len(points) - 1) / (count - 1)) for i in range(count)}
        return [points[i] for i in sorted(picks)]

    def verdict(self) -> str:
        """The run in one line: how it ended, its restarts, and whether its weights are finite."""
        if self.nonfinite_since is not None:
            head = f"NaN weights at step {self.nonfinite_since}"
        elif self.status == "completed":
            of = f" of {self.target_steps}" if self.target_steps is not None else ""
            head = f"completed step {self.end_step}{of}"
        elif self.status is None:
            head = f"stopped at step {self.end_step} (killed: no run_end)"
        else:
            head = f"{self.status} at step {self.end_step}"
            if self.reason:
                head += f" ({self.reason})"
        parts = [head]
        if self.restarts:
            parts.append(_plural(self.restarts, "restart"))
            parts.append(f"{_plural(self.steps_redone, 'step')} redone")
        if self.nonfinite_since is None and self.status == "completed":
            parts.append("weights finite" if self.params_observed else "weights not checked")
        return ", ".join(parts)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _last_attempt(events: list[Event], restart: int) -> list[Event]:
    """One rank's events of the attempt ``restart``, from its last ``run_start`` on."""
    attempt = [e for e in events if e.restart == restart]
    starts = [i for i, e in enumerate(attempt) if e.is_(RunStart)]
    return attempt[starts[-1] :] if starts else attempt


def _nonfinite_since(journal: Journal) -> int | None:
    """The step from which the weights stayed non-finite to the end of the run, or None.

    Any ``params_finite`` observation other than true after the last true one means the
    run ended with non-finite weights. So does a trailing stretch of non-finite losses
    whose updates were applied (not skipped) with no later observation of finite weights.
    """
    steps = [e for e in journal if e.is_(StepObserved)]
    observed = [e for e in steps if "params_finite" in e.fields]
    last_true = max(
        (i for i, e in enumerate(observed) if e.get("params_finite") is True), default=-1
    )
    bad = observed[last_true + 1 :]
    if bad:
        return bad[0].step
    since: list[int] = []
    for rank in journal.ranks:
        trail = []
        for e in reversed([s for s in steps if s.rank == rank]):
            if e.get("params_finite") is True or finite(e.get("loss")) or skipped(e):
                break
            trail.append(e)
        if trail:
            since.append(trail[-1].step)
    return min(since, default=None)


def summarize(journal: Journal) -> RunSummary:
    """Summarize a run from its merged journal (rank 0's view of the loss and progress)."""
    ranks = journal.ranks
    lead = LEAD_RANK if LEAD_RANK in ranks or not ranks else ranks[0]
    own = [e for e in journal if e.rank == lead]
    lead_steps = [e for e in own if e.is_(StepObserved)]
    steps = journal.steps(lead)
    restarts = max((e.restart for e in journal), default=0)
    attempt = _last_attempt(own, restarts)
    highest = max(steps, default=0)
    ends = [e for e in attempt if e.is_(RunEnd)]
    starts = [e for e in journal.of_kind(RunStart) if e.get("target_steps") is not None]
    target = starts[-1].get("target_steps") if starts else None
    times = [as_float(e.get("step_time")) for e in steps.values()]
    usable = [t for t in times if t is not None and math.isfinite(t)]
    loss = {s: as_float(steps[s].get("loss")) for s in sorted(steps)}
    return RunSummary(
        ranks=len(ranks),
        restarts=restarts,
        steps=highest,
        end_step=max((e.step for e in attempt), default=highest),
        target_steps=int(target) if isinstance(target, int) else None,
        status=str(ends[-1].get("status")) if ends else None,
        reason=str(ends[-1].get("reason")) if ends and ends[-1].get("reason") else None,
        steps_redone=len(lead_steps) - len(steps),
        nonfinite_since=_nonfinite_since(journal),
        params_observed=any("params_finite" in e.fields for e in journal.of_kind(StepObserved)),
        loss_by_step=tuple((s, math.nan if v is None else v) for s, v in loss.items()),
        tokens=sum(int(e.get("tokens", 0) or 0) for e in steps.values()),
        median_step_time=statistics.median(usable) if usable else None,
        checkpoints_saved=len(journal.of_kind(CheckpointSaved)),
        checkpoints_loaded=len([e for e in journal.of_kind(CheckpointLoaded) if e.rank == lead]),
    )
