"""The learning-rate controller in the step (opt-in `rl_lr`, docs/stability.md): its
multiplier on the schedule, capped; every step's agreed figures into its window; every
decision journaled as `lr_decided`; a rollback learned from."""

from __future__ import annotations

import math
from typing import Any

from harness.records.events import Detected, LrDecided, Recovered
from reference_trainer.model.optim import lr_at
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState
from reference_trainer.stability.rl_lr import INSTABILITY, LrPolicy, RlLrConfig


class RlLr(Mechanism):
    """Drives an `LrPolicy` from the step."""

    name = "rl_lr"
    state_keys = ("rl_lr",)

    def __init__(self, cfg: RlLrConfig, ctx: BuildContext) -> None:
        self.cfg = cfg
        self.policy = LrPolicy(cfg, ctx.seed)
        self.warmup_steps, self.steps = ctx.warmup_steps, ctx.steps
        self.lr_floor = ctx.stability.lr_floor
        #: A step ran in this process: a later load is a rollback, not a resume.
        self.live = False
        #: A decision made outside a step (at a rollback), journaled at the next step.
        self.pending: dict[str, Any] | None = None

    @classmethod
    def build(cls, ctx: BuildContext) -> RlLr | None:
        """Built when switched on."""
        cfg = ctx.stability.rl_lr
        return cls(cfg, ctx) if cfg.enabled else None

    def cap(self, step: int) -> float:
        """The largest multiplier at 1-based ``step`` that keeps the learning rate within
        ``max_lr_ratio`` of the schedule's peak."""
        shape = lr_at(
            step - 1,
            max_lr=1.0,
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
            min_lr_ratio=self.lr_floor,
        )
        return self.cfg.max_lr_ratio / shape if shape > 0 else math.inf

    def lr_factor(self, step: int) -> float:
        """The multiplier in force, capped."""
        return min(self.policy.multiplier, self.cap(step))

    def begin_step(self, s: StepState) -> None:
        """A decision made at a rollback is journaled with the step that follows it."""
        self.live = True
        if self.pending is not None:
            s.claims.append(self._event(self.pending, s.step))
            self.pending = None

    def finish(self, s: StepState) -> None:
        """The step's agreed figures enter the window; a window's end decides."""
        flagged = s.skip or any(_unstable(claim) for claim in s.claims)
        decision = self.policy.observe(s.loss, s.mean_norm, flagged=flagged)
        if decision is not None:
            s.claims.append(self._event(decision, s.step + 1))

    def _event(self, decision: dict[str, Any], applies_from: int) -> LrDecided:
        cap = self.cap(applies_from)
        return LrDecided(
            multiplier=decision.pop("multiplier"),
            applied=min(self.policy.multiplier, cap),
            from_step=applies_from,
            state=decision.pop("state"),
            reward=decision.pop("reward"),
            details={**decision, "cap": cap if math.isfinite(cap) else None},
        )

    def state_dict(self) -> dict[str, Any]:
        """The table, the window, the generator and a decision not yet journaled."""
        return {"rl_lr": {**self.policy.state_dict(), "pending": self.pending}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume takes the saved policy; a rollback keeps what the run learned and
        learns from the failure (the multiplier in force is penalized)."""
        if self.live:
            self.pending = self.policy.rolled_back()
            return
        saved = state.get("rl_lr")
        if saved:
            self.policy.load_state_dict(saved)
            self.pending = saved.get("pending")


def _unstable(claim: object) -> bool:
    if isinstance(claim, Detected):
        return claim.detector in INSTABILITY
    return isinstance(claim, Recovered) and claim.action in INSTABILITY
