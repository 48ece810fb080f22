"""The non-finite guard: a step whose loss or gradients are not finite on any rank is
skipped on every rank (in fp16 the loss scaler skips it too, as an overflow, whether the
guard is on or not)."""

from __future__ import annotations

from harness.records.events import Detected
from reference_trainer.stability.loss_scale import DynamicLossScaler
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState


class NonfiniteGuard(Mechanism):
    """Skips the update when the ranks' agreed loss or gradient norm is not finite."""

    name = "nonfinite_guard"

    def __init__(self, enabled: bool, scaler: DynamicLossScaler) -> None:
        self.enabled, self.scaler = enabled, scaler

    @classmethod
    def build(cls, ctx: BuildContext) -> NonfiniteGuard:
        """Always built: an fp16 overflow is skipped with the guard off too."""
        return cls(ctx.stability.nonfinite_guard, ctx.scaler)

    def judge(self, s: StepState) -> None:
        """Skip when some rank's loss or gradients are not finite."""
        s.skip = not s.all_finite and (self.enabled or self.scaler.active)
        if s.skip:
            detector = "nonfinite_guard" if not self.scaler.active else "fp16_overflow"
            details = {"loss": s.loss, "grad_norm": s.grad_norm}
            s.claims.append(Detected(detector=detector, details=details))
