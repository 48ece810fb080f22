"""Dynamic precision switching in the step: at its end, blocks near the fp16 limit move to
fp32 and blocks that stayed calm move back (fp16 runs only)."""

from __future__ import annotations

from typing import Any

from harness.records.events import Claim, Detected, Recovered
from reference_trainer.model.gpt import Block
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState
from reference_trainer.stability.precision_switch import ActivationMonitor, Switch


class PrecisionSwitching(Mechanism):
    """Moves the blocks its `ActivationMonitor` watches between fp16 and fp32."""

    name = "precision_switch"
    state_keys = ("monitor",)

    def __init__(self, monitor: ActivationMonitor) -> None:
        self.monitor = monitor

    @classmethod
    def build(cls, ctx: BuildContext) -> PrecisionSwitching | None:
        """Built for fp16 runs with the mechanism on."""
        if ctx.precision != "fp16" or not ctx.stability.precision_switch.enabled:
            return None
        model = ctx.model
        blocks = {f"blocks.{i}": b for i, b in enumerate(model.blocks) if isinstance(b, Block)}
        return cls(ActivationMonitor(ctx.stability.precision_switch, blocks))

    def end_step(self, s: StepState) -> None:
        """Switch the blocks whose activations say so."""
        s.claims += switch_claims(self.monitor.end_step(s.step))

    def precision_changed(self, name: str) -> None:
        """Out of fp16 no block runs in fp32 on its own."""
        if name != "fp16":
            for block in self.monitor.blocks.values():
                block.fp32 = False

    def state_dict(self) -> dict[str, Any]:
        """The blocks' states."""
        return {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the blocks' states, when the checkpoint has them."""
        if state.get("monitor"):
            self.monitor.load_state_dict(state["monitor"])


def switch_claims(switches: list[Switch]) -> list[Claim]:
    """A block moved to fp32 was detected near the fp16 limit; every move is a recovery."""
    claims: list[Claim] = []
    for switch in switches:
        details = {"layer": switch.layer, "max_abs": switch.max_abs}
        if switch.to == "fp32":
            claims.append(Detected(detector="activation_range", details=dict(details)))
        claims.append(Recovered(action=f"precision_{switch.to}", details=details))
    return claims
