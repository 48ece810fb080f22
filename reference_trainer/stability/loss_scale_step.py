"""Dynamic loss scaling in the step: after the update the scale grows, backs off or holds
(`DynamicLossScaler.update`), and a layer that stalled in fp16 raises it."""

from __future__ import annotations

from harness.records.events import Claim, Detected, Recovered
from reference_trainer.stability.loss_scale import DynamicLossScaler, ScaleChange
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState


class LossScaling(Mechanism):
    """Updates the trainer's loss scaler at the end of each step."""

    name = "loss_scale"

    def __init__(self, scaler: DynamicLossScaler, max_scale: float) -> None:
        self.scaler, self.max_scale = scaler, max_scale

    @classmethod
    def build(cls, ctx: BuildContext) -> LossScaling:
        """Always built: the scaler decides for itself whether it is active."""
        return cls(ctx.scaler, ctx.stability.underflow.max_scale)

    def end_step(self, s: StepState) -> None:
        """Grow, back off or hold the scale; raise it when gradients flushed to zero."""
        change = self.scaler.update(overflow=not s.all_finite)
        if s.stalled and s.all_finite and change is None:  # gradients flushed to zero in fp16
            change = self.scaler.raise_scale(self.max_scale)
        s.claims += scale_claims(change)


def scale_claims(change: ScaleChange | None) -> list[Claim]:
    """A growth or a raise is a recovery; a backoff or a hysteresis tick, a detection."""
    if change is None:
        return []
    name = "loss_scale_" + change.action
    details = {"old": change.old, "new": change.new, "hysteresis_left": change.hysteresis_left}
    if change.action in ("growth", "raised"):
        return [Recovered(action=name, details=details)]
    return [Detected(detector=name, details=details)]
