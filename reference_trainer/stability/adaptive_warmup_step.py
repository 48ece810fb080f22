"""The adaptive warmup in the step: its factor lowers the learning rate of a noisy start,
its claim names the fall, and every good step's agreed gradient norm enters its window."""

from __future__ import annotations

from typing import Any

from harness.records.events import OMIT
from reference_trainer.stability.adaptive_warmup import AdaptiveWarmup, AdaptiveWarmupConfig
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState


class AdaptiveWarmupStep(Mechanism):
    """Drives an `AdaptiveWarmup` (which does nothing while its config is off)."""

    name = "adaptive_warmup"
    state_keys = ("adaptive_warmup",)

    def __init__(self, cfg: AdaptiveWarmupConfig, warmup_steps: int) -> None:
        self.cfg, self.warmup_steps = cfg, warmup_steps
        self.warmup = AdaptiveWarmup(cfg, warmup_steps)

    @classmethod
    def build(cls, ctx: BuildContext) -> AdaptiveWarmupStep:
        """Always built: its state is in every checkpoint, on or off."""
        return cls(ctx.stability.adaptive_warmup, ctx.warmup_steps)

    def lr_factor(self, step: int) -> float:
        """1 after warmup, lower during a noisy one."""
        return self.warmup.factor(step)

    def begin_step(self, s: StepState) -> None:
        """The claim of a falling factor, and the figures the `step` event journals."""
        noisy = self.warmup.claim(s.step, s.lr)
        if noisy is not None:
            s.claims.append(noisy)
        variance = self.warmup.grad_variance()
        s.observed["grad_variance"] = OMIT if variance is None else variance
        # The factor is journaled while it can act: during warmup, with the mechanism on.
        in_warmup = self.cfg.enabled and s.step <= self.warmup_steps
        s.observed["warmup_factor"] = self.warmup.factor(s.step) if in_warmup else OMIT

    def after_update(self, s: StepState) -> None:
        """A good step's agreed gradient norm enters the window."""
        if not s.skip:
            self.warmup.observe(s.mean_norm)

    def state_dict(self) -> dict[str, Any]:
        """The window and the claim latch."""
        return {"adaptive_warmup": self.warmup.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the window; a checkpoint from before the mechanism starts it afresh."""
        if "adaptive_warmup" in state:
            self.warmup.load_state_dict(state["adaptive_warmup"])
        else:
            self.warmup.reset()
