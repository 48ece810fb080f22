"""Is the model still healthy: finite weights, a finished run, a loss near the baseline's,
an fp16 loss scale that settled again."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation, ExpectModel
from harness.oracles.recovery import step_conflict
from harness.oracles.verdict import Check, Evidence
from harness.records.events import RunEnd, RunStart, StepObserved
from harness.records.journal import Event, Journal
from harness.records.timeline import (
    LEAD_RANK,
    NO_FAULT,
    as_float,
    faults,
    finite,
    first_fault,
    lead_steps,
    plural,
    skipped,
    surviving_losses,
)

#: Steps averaged for a run's final loss: one step's loss is too noisy to compare.
FINAL_WINDOW = 5


@dataclass(frozen=True)
class ParamsFiniteOracle(ExpectOracle):
    """Every parameter stays finite, as the agent observed it (not as the trainer claims)."""

    name = "params_finite"
    expectation = Expectation(
        type=bool,
        order=2,
        passes_when="no parameter check found a non-finite parameter, and every rank's last "
        "step has a finite loss",
        figure="signs of non-finite weights: observations that saw them, plus ranks whose "
        "last step applied a non-finite loss (the detail gives each count)",
    )

    def observed(self, journal: Journal) -> list[Event]:
        """Every step's check, and the attached agent's last look in run_end."""
        return [e for e in journal.of_kind(StepObserved, RunEnd) if "params_finite" in e.fields]

    def judge(self, evidence: Evidence) -> Check:
        """Count of observations of non-finite parameters and of last steps that applied a
        non-finite loss, said alike in the figure and the detail."""
        journal = evidence.journal
        observed = self.observed(journal)
        seen = [e for e in observed if e.get("params_finite") is not True]
        # A non-finite loss that was not skipped went into the weights the run ended with:
        # evidence too, but no observation of the weights (counted apart in the detail).
        unguarded = []
        for rank in journal.ranks:
            steps = journal.steps(rank)
            if not steps:
                continue
            last = steps[max(steps)]
            if not finite(last.get("loss")) and not skipped(last) and last not in seen:
                unguarded.append(last)
        bad = [*seen, *unguarded]
        if not observed and not bad:
            return self.not_judged(
                "never observed: no step or run_end event carries params_finite",
                unit="",
                expected="true",
            )
        if bad:
            first = min(bad, key=lambda e: e.wall)
            where = f"the first on rank {first.rank} at step {first.step}"
            saw = f"{len(seen)} of {plural(len(observed), 'observation')}"
            applied = f"{plural(len(unguarded), 'last step')} that applied a non-finite loss"
            if not unguarded:
                detail = f"{saw} saw non-finite weights, {where}"
            else:
                # The figure counts both kinds; the words say how many of each.
                parts = f"{saw} saw them, {applied}" if seen else applied
                detail = f"{plural(len(bad), 'sign')} of non-finite weights ({parts}), {where}"
        else:
            detail = f"parameters finite at all {plural(len(observed), 'observation')}"
        return self.verdict(
            not bad,
            len(bad),
            unit="",
            expected="true",
            detail=detail,
            observations=len(observed),
            first_bad_step=min(bad, key=lambda e: e.wall).step if bad else None,
        )


@dataclass(frozen=True)
class KeptParamsFiniteOracle(ParamsFiniteOracle):
    """Every step the final weights descend from had finite parameters: like
    ``params_finite``, but a step trained again after a rollback or restart is judged by
    its last attempt only (a guard that rolled a non-finite step back held)."""

    name = "kept_params_finite"
    expectation = Expectation(
        type=bool,
        order=15,
        passes_when="like `params_finite`, but judged on the step attempts the final weights "
        "descend from: a step the agent saw non-finite and the run then rolled back and "
        "trained again counts by its last attempt (the soak's invariant, docs/soak.md)",
        figure="non-finite observations",
    )

    def observed(self, journal: Journal) -> list[Event]:
        """The checks of each rank's surviving step attempts, and each rank's last run_end."""
        kept = {id(e) for rank in journal.ranks for e in journal.steps(rank).values()}
        ends = {e.rank: e for e in journal.of_kind(RunEnd)}
        return [
            e
            for e in super().observed(journal)
            if id(e) in kept or (e.is_(RunEnd) and ends.get(e.rank) is e)
        ]


@dataclass(frozen=True)
class CompletedOracle(ExpectOracle):
    """The run trained to its target step and every rank of its last attempt finished."""

    name = "completed"
    expectation = Expectation(
        type=bool,
        order=3,
        baseline="command",
        passes_when="the launcher exited 0, rank 0 reached `trainer.steps`, and every rank "
        "of the last attempt ended `completed`",
        figure="highest step reached",
    )

    def judge(self, evidence: Evidence) -> Check:
        """Highest step rank 0 reached; fails naming each missing piece of evidence."""
        journal, target = evidence.journal, evidence.target_steps
        expected = f"exit 0, step {target}, every rank completed"
        if not journal and evidence.exit_code == 0:
            # A clean exit says nothing of training: the trainer may never have run the agent.
            return self.not_judged(
                "the journal is empty: the launcher exited 0 but no rank reported anything",
                unit="steps",
                expected=expected,
                exit_code=evidence.exit_code,
            )
        if (conflict := step_conflict(journal)) is not None:
            return self.not_judged(
                conflict, unit="steps", expected=expected, exit_code=evidence.exit_code
            )
        missing: list[str] = []
        if evidence.exit_code is None:
            missing.append("the launcher was killed at its deadline")
        elif evidence.exit_code != 0:
            missing.append(f"the launcher exited with code {evidence.exit_code}")
        top = max((e.step for e in lead_steps(journal)), default=None)
        if top is None:
            missing.append(f"rank {LEAD_RANK} reported no step")
        elif top != target:
            missing.append(f"rank {LEAD_RANK} reached step {top} of {target}")
        last, attempt = _last_attempt(journal)
        if last is None:
            missing.append("the journal is empty")
        else:
            missing += _unfinished_ranks(attempt)
        detail = "; ".join(missing) if missing else f"trained to step {target} and finished"
        return self.verdict(
            not missing,
            top,
            unit="steps",
            expected=expected,
            detail=detail,
            exit_code=evidence.exit_code,
            restarts=last,
        )


def _last_attempt(journal: Journal) -> tuple[int | None, list[Event]]:
    """The last attempt's restart number and events: the restart of the latest event (not
    the highest: a job stopped and launched again, `resume_after`, numbers its restarts
    from 0 again), each rank's events from its latest start of that attempt."""
    if not journal:
        return None, []
    last = max(journal, key=lambda e: e.wall).restart
    same = [e for e in journal if e.restart == last]
    begun = {e.rank: e.wall for e in same if e.is_(RunStart)}  # wall order: the latest
    return last, [e for e in same if e.wall >= begun.get(e.rank, -math.inf)]


def _unfinished_ranks(attempt: list[Event]) -> list[str]:
    """What keeps the ranks of one attempt from counting as completed."""
    ranks = {e.rank for e in attempt}
    for start in (e for e in attempt if e.is_(RunStart)):
        size = start.get("world_size")
        if isinstance(size, int) and not isinstance(size, bool):
            # A rank that died before writing anything still belonged to the job.
            ranks |= set(range(size))
    ends = {e.rank: e for e in attempt if e.is_(RunEnd)}
    problems = []
    for rank in sorted(ranks):
        end = ends.get(rank)
        if end is None:
            problems.append(f"rank {rank} wrote no run_end")
        elif end.get("status") != "completed":
            reason = end.get("reason")
            why = f" ({reason})" if reason else ""
            problems.append(f"rank {rank} ended {end.get('status')}{why}")
    return problems


def final_loss(losses: list[float]) -> float | None:
    """Mean of the last `FINAL_WINDOW` losses; None when there are none."""
    window = losses[-FINAL_WINDOW:]
    return sum(window) / len(window) if window else None


def relative_gap(value: float, reference: float) -> float:
    """|value - reference| / |reference|; infinite when only the reference is zero."""
    if reference == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value - reference) / abs(reference)


@dataclass(frozen=True)
class FinalLossOracle(ExpectOracle):
    """The final loss is within a relative tolerance of the fault-free baseline's."""

    name = "final_loss_within"
    expectation = Expectation(
        type=float,
        field=Field(gt=0, le=10, description="Largest relative gap to the baseline's loss."),
        order=4,
        symbol="t",
        baseline="always",
        passes_when="the mean loss of the last 5 steps is within a relative `t` of the "
        "fault-free baseline's",
        figure="relative gap",
    )
    tolerance: float = 0.05

    @classmethod
    def from_expect(cls, value: Any) -> FinalLossOracle:
        """From ``final_loss_within: T``."""
        return cls(tolerance=float(value))

    def judge(self, evidence: Evidence) -> Check:
        """Relative gap |final - baseline| / |baseline| of the final losses."""
        expected = f"<= {self.tolerance:g}"
        if evidence.baseline is None:
            return self.not_judged(
                "no fault-free baseline run to compare the final loss with",
                unit="relative",
                expected=expected,
            )
        final = final_loss(surviving_losses(evidence.journal))
        base = final_loss(surviving_losses(evidence.baseline))
        if final is None or base is None:
            which = "faulted run" if final is None else "fault-free baseline run"
            return self.not_judged(
                f"the {which} reported no step on rank {LEAD_RANK}, so there is no final "
                "loss to compare",
                unit="relative",
                expected=expected,
            )
        gap = relative_gap(final, base)
        passed = math.isfinite(gap) and gap <= self.tolerance
        return self.verdict(
            passed,
            gap,
            unit="relative",
            expected=expected,
            detail=f"final loss {final:.4g} against the baseline's {base:.4g} "
            f"(mean of the last {FINAL_WINDOW} steps)",
            final_loss=final,
            baseline_loss=base,
        )


class LossScaleExpect(ExpectModel):
    """After the fault the fp16 loss scale settles again."""

    within_steps: int = Field(default=10, ge=1, description="Steps allowed to settle.")
    min_fraction: float = Field(
        default=1e-3,
        gt=0,
        le=1,
        description="The final scale is at least this share of the scale before the fault.",
    )


@dataclass(frozen=True)
class LossScaleRecoveredOracle(ExpectOracle):
    """After the fault the fp16 loss scale settles: near its old value, no more skips."""

    name = "loss_scale_recovered"
    expectation = Expectation(
        type=LossScaleExpect | bool,
        order=10,
        passes_when="in fp16, the final loss scale is at least `min_fraction` of the scale "
        "before the fault and no step was skipped more than `within_steps` after it",
        figure="final / pre-fault scale",
    )
    within_steps: int = LossScaleExpect().within_steps
    min_fraction: float = LossScaleExpect().min_fraction

    @classmethod
    def from_expect(cls, value: Any) -> LossScaleRecoveredOracle:
        """From ``loss_scale_recovered: true`` or a `LossScaleExpect`."""
        expect = value if isinstance(value, LossScaleExpect) else LossScaleExpect()
        return cls(within_steps=expect.within_steps, min_fraction=expect.min_fraction)

    def judge(self, evidence: Evidence) -> Check:
        """Ratio of the final loss scale to the one before the first fault."""
        expected = (
            f">= {self.min_fraction:g} of the scale before the fault, "
            f"no skip {plural(self.within_steps, 'step')} after it"
        )

        def unjudged(detail: str) -> Check:
            return self.not_judged(detail, unit="", expected=expected)

        journal = evidence.journal
        first = first_fault(journal)
        if first is None:
            return unjudged(f"{NO_FAULT}, so the loss scale had nothing to recover from")
        steps = lead_steps(journal)
        scaled = [e for e in steps if as_float(e.get("loss_scale")) is not None]
        if not scaled:
            return unjudged(f"no loss scale observed on rank {LEAD_RANK} (not an fp16 run?)")
        before = [e for e in scaled if e.wall < first.wall]
        if not before:
            return unjudged(
                f"no loss scale observed before the fault at step {first.step}, so there is "
                "nothing to recover to"
            )
        pre = as_float(before[-1].get("loss_scale")) or 0.0
        final = as_float(steps[-1].get("loss_scale"))
        if final is None:
            return unjudged(
                f"the last step ({steps[-1].step}) has no loss scale (it ended in fp32?)"
            )
        ratio = final / pre if pre > 0 and math.isfinite(pre) else math.nan
        last = faults(journal)[-1]
        settle_by = last.step + self.within_steps
        late = [e for e in steps if e.wall >= last.wall and e.step > settle_by and skipped(e)]
        problems = []
        if not math.isfinite(final):
            problems.append(f"the final loss scale is {final}")
        elif not ratio >= self.min_fraction:
            problems.append(f"the loss scale fell from {pre:g} to {final:g}")
        if late:
            problems.append(
                f"{plural(len(late), 'step')} still skipped after step {settle_by}, "
                f"the first {late[0].step}"
            )
        detail = "; ".join(problems) or f"the loss scale went from {pre:g} to {final:g}"
        return self.verdict(
            not problems,
            ratio,
            unit="",
            expected=expected,
            detail=detail,
            before=pre,
            final=final,
            late_skips=len(late),
        )
