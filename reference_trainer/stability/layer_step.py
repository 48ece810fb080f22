"""The per-layer checks in the step: statistics of every layer, the swing detector (a layer
whose gradient swung up skips the step on every rank), the stall detector (a layer that
stopped updating), and gradient surgery, which repairs a swung layer instead of skipping.

One mechanism for the three switches (`layer_stats`, `underflow`, `surgery`): they share
the `LayerMonitor`, and surgery acts on what the swing detector found at the same step."""

from __future__ import annotations

from typing import Any

import torch

from harness.records.events import Claim, Detected, Recovered
from reference_trainer.stability.layer_monitor import GradientVerdict, LayerMonitor
from reference_trainer.stability.loss_scale import DynamicLossScaler
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState
from reference_trainer.stability.surgery import GradientSurgeon


class LayerChecks(Mechanism):
    """Drives the `LayerMonitor` and, when on, the `GradientSurgeon`."""

    name = "layer_stats"
    state_keys = ("layers", "surgery")
    #: Some rank saw a layer swing up, one stall, and how many saw a repairable layer.
    idle_slice = 3

    def __init__(
        self,
        monitor: LayerMonitor,
        surgeon: GradientSurgeon | None,
        scaler: DynamicLossScaler,
        world_size: int,
    ) -> None:
        self.monitor, self.surgeon, self.scaler = monitor, surgeon, scaler
        self.world_size = world_size
        self.verdict = GradientVerdict()
        self.swung, self.repairable_on = False, 0

    @classmethod
    def build(cls, ctx: BuildContext) -> LayerChecks | None:
        """Built when the statistics or the stall detector is on (surgery needs them)."""
        st, model = ctx.stability, ctx.model
        if not (st.layer_stats.enabled or st.underflow.enabled):
            return None
        monitor = LayerMonitor(st.layer_stats, st.underflow, model, list(model.blocks), model.ln_f)
        surgeon = GradientSurgeon(st.surgery, monitor.stats.params) if st.surgery.enabled else None
        return cls(monitor, surgeon, ctx.scaler, ctx.topo.world_size)

    def lr_factor(self, step: int) -> float:
        """Safe mode after surgery trains at a lower learning rate."""
        return self.surgeon.lr_factor if self.surgeon is not None else 1.0

    def begin_step(self, s: StepState) -> None:
        """A new step of statistics."""
        self.monitor.begin(s.step)

    def after_backward(self, s: StepState) -> None:
        """Judge the unscaled gradients against each layer's history."""
        self.verdict = self.monitor.gradients()

    def local_slice(self, s: StepState) -> list[float]:
        """This rank's swing, stall and whether surgery could repair its layers."""
        v = self.verdict
        return [float(v.skip), float(v.stalled), float(bool(v.repairable))]

    def agreed(self, s: StepState, values: torch.Tensor) -> None:
        """What the ranks together saw."""
        self.swung = bool(values[0] > 0)  # on this rank or another
        s.stalled = bool(values[1] > 0)
        self.repairable_on = round(float(values[2]))

    def judge(self, s: StepState) -> None:
        """Finite, but one layer's gradient is orders of magnitude off its norm: skip."""
        s.skip = s.skip or self.swung

    def repair(self, s: StepState) -> None:
        """Surgery instead of a skip, when it can; the claims of the layers' verdict."""
        # One or some layers' gradients went wrong, on every rank alike (the same gradients
        # after the all-reduce), and the forward pass was normal: repair, do not skip.
        # (In fp16 a non-finite gradient is an overflow: the loss scaler's, not surgery's.)
        everywhere = self.repairable_on == self.world_size
        if s.skip and everywhere and (s.all_finite or not self.scaler.active):
            repaired = self._operate(self.verdict.repairable, s.step, s.loss)
            s.claims += repaired
            s.skip = not repaired
        verdict = self.verdict
        s.claims += [Detected(detector="layer_swing", details=w.details) for w in verdict.swings]
        if self.swung and not verdict.skip:
            s.claims.append(Detected(detector="layer_swing", details={"other_rank": True}))
        s.claims += [Detected(detector="stalled_layer", details=d) for d in verdict.stalls]
        if self.surgeon is not None and not s.skip and not self.swung:
            self.surgeon.remember(s.loss)

    def _operate(self, layers: list[str], step: int, loss: float) -> list[Claim]:
        """Gradient surgery on every layer whose gradient swung up or is not finite, when the
        forward pass was normal and each layer has a window to cut against; the claims of
        what was done, or none (the step is then skipped)."""
        surgeon = self.surgeon
        if surgeon is None or not layers:
            return []
        ready = all(surgeon.can_operate(layer) for layer in layers)
        if not ready or not surgeon.forward_was_normal(loss):
            return []
        claims: list[Claim] = []
        for layer in layers:
            median = self.monitor.history.median(layer, "grad_norm") or 0.0
            details = surgeon.operate(layer, median, step)
            claims.append(Recovered(action="gradient_surgery", details=details))
        return claims

    def adjust_gradients(self, s: StepState) -> None:
        """Safe mode's structured dropout, and its lower clipping threshold."""
        if self.surgeon is not None:
            self.surgeon.apply_dropout()
            s.clip_factor *= self.surgeon.clip_factor

    def before_update(self, s: StepState) -> None:
        """The weights before the update, for the update's size."""
        self.monitor.before_update()

    def after_update(self, s: StepState) -> None:
        """The update's size (none when skipped)."""
        self.monitor.after_update(skipped=s.skip)

    def finish(self, s: StepState) -> None:
        """The step's statistics, a layer whose activations swung, the end of safe mode."""
        s.layers, peaks = self.monitor.finish()
        s.claims += [Detected(detector="layer_swing", details=w.details) for w in peaks]
        surgeon = self.surgeon
        if surgeon is not None and surgeon.safe_layer is not None:
            name = surgeon.safe_layer
            norm = s.layers.value(name, "grad_norm")
            lasted = surgeon.end_step(s.step, norm, self.monitor.history.median(name, "grad_norm"))
            if lasted is not None:
                ended: dict[str, Any] = {"layer": name, "steps": lasted}
                s.claims.append(Recovered(action="safe_mode_ended", details=ended))

    def state_dict(self) -> dict[str, Any]:
        """Each layer's history and stall streaks; surgery's windows and safe mode."""
        surgery = self.surgeon.state_dict() if self.surgeon is not None else {}
        return {"layers": self.monitor.state_dict(), "surgery": surgery}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what the checkpoint holds of them."""
        if state.get("layers"):
            self.monitor.load_state_dict(state["layers"])
        if self.surgeon is not None and state.get("surgery"):
            self.surgeon.load_state_dict(state["surgery"])
